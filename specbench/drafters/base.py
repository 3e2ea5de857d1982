"""The drafter interface, for drafter authors: :class:`Drafter` and what it exchanges with the engine.

The classes live with the engine that calls them (:mod:`specbench.decoding.protocol`, where the life cycle
and the hidden-state convention are described); this module names them where drafters are written.
"""

from specbench.decoding.protocol import Drafter, Proposal, VerifierNeeds, VerifierView

__all__ = ["Drafter", "Proposal", "VerifierNeeds", "VerifierView"]
