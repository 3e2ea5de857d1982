"""Few-shot exemplars for base (non-chat) models.

GSM8K: the 8 chain-of-thought exemplars of Wei et al. (2022), "Chain-of-thought prompting elicits
reasoning in large language models", Table 20 (the standard GSM8K 8-shot CoT prompt).
MBPP: three exemplars in the prompt format of Austin et al. (2021), "Program synthesis with large
language models" (task text, tests, code between [BEGIN] and [DONE]), modelled on the MBPP prompt-split
tasks 2-4.
"""

from __future__ import annotations

GSM8K_COT: tuple[tuple[str, str], ...] = (
    (
        (
            "There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they "
            "are done, there will be 21 trees. How many trees did the grove workers plant today?"
        ),
        (
            "There are 15 trees originally. Then there were 21 trees after some more were planted. So there "
            "must have been 21 - 15 = 6. The answer is 6."
        ),
    ),
    (
        (
            "If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the parking "
            "lot?"
        ),
        "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5.",
    ),
    (
        (
            "Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have left "
            "in total?"
        ),
        (
            "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. After "
            "eating 35, they had 74 - 35 = 39. The answer is 39."
        ),
    ),
    (
        (
            "Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many "
            "lollipops did Jason give to Denny?"
        ),
        (
            "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave Denny "
            "20 - 12 = 8. The answer is 8."
        ),
    ),
    (
        (
            "Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys "
            "does he have now?"
        ),
        (
            "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more "
            "toys. 5 + 4 = 9. The answer is 9."
        ),
    ),
    (
        (
            "There were nine computers in the server room. Five more computers were installed each day, from "
            "monday to thursday. How many computers are now in the server room?"
        ),
        (
            "There were originally 9 computers. For each of 4 days, 5 more computers were added. So "
            "5 * 4 = 20 computers were added. 9 + 20 is 29. The answer is 29."
        ),
    ),
    (
        (
            "Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. How "
            "many golf balls did he have at the end of wednesday?"
        ),
        (
            "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After "
            "losing 2 more, he had 35 - 2 = 33 golf balls. The answer is 33."
        ),
    ),
    (
        "Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
        (
            "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has "
            "23 - 15 dollars left. 23 - 15 is 8. The answer is 8."
        ),
    ),
)

MBPP_EXEMPLARS: tuple[dict, ...] = (
    {
        "text": "Write a function to find the shared elements from the given two lists.",
        "test_list": ["assert set(similar_elements((3, 4, 5, 6), (5, 7, 4, 10))) == set((4, 5))"],
        "code": "def similar_elements(test_tup1, test_tup2):\n"
        "    res = tuple(set(test_tup1) & set(test_tup2))\n    return res",
    },
    {
        "text": "Write a python function to identify non-prime numbers.",
        "test_list": ["assert is_not_prime(2) == False"],
        "code": "import math\n\ndef is_not_prime(n):\n    if n < 2:\n        return True\n"
        "    for i in range(2, int(math.sqrt(n)) + 1):\n        if n % i == 0:\n            return True\n"
        "    return False",
    },
    {
        "text": "Write a function to find the n largest integers from a given list of numbers, returned in "
        "descending order.",
        "test_list": ["assert heap_queue_largest([25, 35, 22, 85, 14, 65, 75, 22, 58], 3) == [85, 75, 65]"],
        "code": "import heapq as hq\n\ndef heap_queue_largest(nums, n):\n    return hq.nlargest(n, nums)",
    },
)
