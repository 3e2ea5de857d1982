"""A small OpenAI-compatible completions server for the tests: the tiny model over real HTTP (FastAPI).

It answers what ``task=synth synth.backend=openai`` sends a vLLM server: ``GET /v1/models`` and
``POST /v1/completions`` with the prompt as token ids, ``max_tokens``, ``temperature`` (0: greedy),
``top_p``, ``top_k`` (-1 / 0: off), ``seed``, ``logit_bias`` and ``logprobs``, and vLLM's
``return_tokens_as_token_ids`` (generated tokens as ``"token_id:N"``). Generation is transformers' own
``generate`` (an implementation independent of specbench's engine); like vLLM, the EOS token that ends a row
is in the token ids and in
``usage.completion_tokens`` but not in the text, and ``stop_reason`` is null for the tokenizer's EOS.

``token_ids=False`` plays a server that ignores ``return_tokens_as_token_ids`` (text and plain token
strings only). The server counts requests in flight (``state.max_in_flight``) so tests can check the
client's concurrency bound.

Run it by hand: ``python tests/openai_server.py --port 8011`` (tiny random llama, seed 0, 2 layers).
"""

from __future__ import annotations

import argparse
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import uvicorn
from fastapi import Body, FastAPI, HTTPException
from transformers import LogitsProcessor, LogitsProcessorList


@dataclass
class ServerState:
    lock: threading.Lock = field(default_factory=threading.Lock)  # one generation at a time
    count_lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    max_in_flight: int = 0
    requests: int = 0


def _prompt_ids(prompt, tokenizer) -> list[int]:
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, add_special_tokens=False)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        return prompt[0]
    raise HTTPException(
        400, "this test server takes one prompt per request (a string or a list of token ids)"
    )


def create_app(model, tokenizer, model_name: str = "tiny", token_ids: bool = True) -> FastAPI:
    """The FastAPI app serving ``model`` (a transformers causal LM) as ``model_name``."""
    app = FastAPI()
    state = ServerState()
    app.state.counters = state
    eos = model.generation_config.eos_token_id
    eos_ids = {eos} if isinstance(eos, int) else set(eos or [])

    @app.get("/v1/models")
    def models() -> dict:
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "tests"}],
        }

    @app.post("/v1/completions")
    def completions(body: dict = Body(...)) -> dict:  # noqa: B008  (FastAPI's way to read a JSON body)
        if body.get("model") != model_name:
            raise HTTPException(404, f"The model `{body.get('model')}` does not exist.")
        if int(body.get("n") or 1) != 1:
            raise HTTPException(400, "this test server returns one choice per request")
        prompt = _prompt_ids(body.get("prompt"), tokenizer)
        with state.count_lock:
            state.in_flight += 1
            state.requests += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            with state.lock:
                output, logprobs = _generate(model, prompt, body)
        finally:
            with state.count_lock:
                state.in_flight -= 1
        finished = bool(output) and output[-1] in eos_ids
        want_logprobs = body.get("logprobs") is not None
        as_ids = token_ids and bool(body.get("return_tokens_as_token_ids"))
        tokens = [f"token_id:{t}" if as_ids else tokenizer.decode([t]) for t in output]
        choice = {
            "index": 0,
            "text": tokenizer.decode(output, skip_special_tokens=True),
            "logprobs": {
                "tokens": tokens,
                "token_logprobs": logprobs,
                "top_logprobs": None,
                "text_offset": None,
            }
            if want_logprobs
            else None,
            "finish_reason": "stop" if finished else "length",
            "stop_reason": None,
        }
        return {
            "id": f"cmpl-{state.requests}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(output),
                      "total_tokens": len(prompt) + len(output)},
        }

    return app


class _LogitBias(LogitsProcessor):
    """OpenAI's ``logit_bias``: {token id: bias} added to the logits before sampling."""

    def __init__(self, bias: dict):
        self.bias = {int(k): float(v) for k, v in bias.items()}

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        for token, value in self.bias.items():
            scores[:, token] += value
        return scores


def _generate(model, prompt: list[int], body: dict) -> tuple[list[int], list[float]]:
    temperature = float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0)
    top_k = int(body.get("top_k") or 0)
    kwargs = {"do_sample": temperature > 0}
    if temperature > 0:
        kwargs.update(temperature=temperature, top_p=float(body.get("top_p") or 1.0), top_k=max(top_k, 0))
    ids = torch.tensor([prompt])
    if body.get("logit_bias"):
        kwargs["logits_processor"] = LogitsProcessorList([_LogitBias(body["logit_bias"])])
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        if body.get("seed") is not None:
            torch.manual_seed(int(body["seed"]))
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=int(body.get("max_tokens") or 16),
            pad_token_id=model.generation_config.pad_token_id,
            eos_token_id=model.generation_config.eos_token_id,
            return_dict_in_generate=True,
            output_scores=True,
            **kwargs,
        )
    output = out.sequences[0, len(prompt):].tolist()
    logprobs = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, output)]
    return output, logprobs


class RunningServer:
    """A uvicorn server in a thread on 127.0.0.1 and a free port; ``url`` once started."""

    def __init__(self, app: FastAPI):
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def state(self) -> ServerState:
        return self.app.state.counters

    def start(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test OpenAI server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@contextmanager
def serve(model, tokenizer, model_name: str = "tiny", token_ids: bool = True):
    """``with serve(model, tokenizer) as server: server.url``: serves until the block ends."""
    running = RunningServer(create_app(model, tokenizer, model_name, token_ids))
    running.start()
    try:
        yield running
    finally:
        running.stop()


def main() -> None:
    from specbench.models.tiny import byte_tokenizer, tiny_random_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--name", default="tiny")
    args = parser.parse_args()
    model = tiny_random_model("llama", seed=args.seed, num_layers=args.layers)
    uvicorn.run(create_app(model, byte_tokenizer(), args.name), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
