"""The forty-fourth hostile pass, SDK parity (letter J): the Python
LeaseWorker's ``accept`` on an ACK answer that carries no lease.

A rogue path in front of the real server (a proxy) answers the job's ACK
with the coordinator's accepted decision and no lease in it (or text, or a
list, where the lease goes). The TypeScript worker refuses it ("no lease
in the answer"); the Python worker failed closed too, but with a bare
``KeyError: 'lease'`` (``AttributeError`` for text or a list) from inside
the SDK, not in its vocabulary: a caller that handles the SDK's refusals
(``AckRefused``) and lets nothing else through crashed instead. The answer
is now an ``AckRefused`` saying the answer carried no lease, and no job
begins.
"""

from __future__ import annotations

import pytest

from test_rogue44a import World
from tether_agentsdk.leaseworker import AckRefused


def _no_lease(shape):
    def swap(m: str, real: dict, other: dict | None) -> dict | None:
        if m != "Ack":
            return None
        forged = {k: v for k, v in real.items() if k != "lease"}
        if shape is not None:
            forged["lease"] = shape
        return forged
    return swap


@pytest.mark.parametrize("shape", [None, "lease-44j", ["lease-44j"]], ids=["absent", "text", "list"])
def test_rogue44j_an_ack_answer_without_a_lease_is_refused_in_the_sdks_words(server, tree, tmp_path, shape):
    with pytest.raises(AckRefused) as refused:
        w = World(server, tree, tmp_path, "nolease", ack_swap=_no_lease(shape))
        w.close()
    assert "no lease in the answer" in str(refused.value), f"the refusal reads {str(refused.value)!r}"
