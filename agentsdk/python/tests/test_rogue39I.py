"""The thirty-ninth hostile pass on the Python SDK's Verifier: one whose
conn holds an agent's credential follows only that agent's tree's
revocations, yet it accepted any token the control plane signed. A rogue
of another tree presented its token there, was revoked in its own tree,
and was still served until its token expired, since the verifier never
heard of the revocation. Tokens now name their tree (the root claim) and
the feed the tree it follows (treeRoot): the tree-scoped verifier refuses
another tree's token (TreeNotFollowed); one following the whole feed is
unchanged."""

from __future__ import annotations

from conftest import NO_RETRY, require_extra
from tether_agentsdk import Agent, Conn, GrantRevoked, TreeNotFollowed, Verifier


def test_rogue39I_a_tree_scoped_verifier_refuses_another_trees_token(server):
    require_extra("cryptography")
    op = server.operator()
    ours = Agent.register_root(op, "rogue39I-ours")
    rogue = Agent.register_root(op, "rogue39I-rogue")

    def issue(node: str) -> dict:
        return op.call("CapabilityService", "IssueRoot", {"holderNodeId": node, "scopes": ["tool:*"], "ttl": "3600s"})

    own, canary, rogues = issue(ours.node_id), issue(ours.node_id), issue(rogue.node_id)
    scoped = Verifier(ours.conn, staleness_budget=60)
    whole = Verifier(Conn(server.url, server.admin, retry=NO_RETRY), staleness_budget=60)
    try:
        for v in (scoped, whole):
            v.start()
            assert v.ready.wait(30), "the verifier never heard the feed"
        assert scoped.tree == ours.node_id
        assert whole.tree == ""
        for v in (scoped, whole):
            v.authorize(own["token"], "tool:search")
        whole.authorize(rogues["token"], "tool:search")

        # The rogue is revoked in its own tree; then a revocation in ours,
        # so that the scoped verifier has heard the feed past the rogue's.
        op.call("CapabilityService", "Revoke", {"grantId": rogues["grant"]["grantId"], "reason": "rogue"})
        seq = int(op.call("CapabilityService", "Revoke", {"grantId": canary["grant"]["grantId"], "reason": "canary"})["sequence"])
        for v in (scoped, whole):
            assert v.wait_for_sequence(seq, timeout=30), "the verifier did not reach the revocations"
        try:
            scoped.verify(canary["token"])
            raise AssertionError("our revoked canary was accepted")
        except GrantRevoked:
            pass
        try:
            scoped.authorize(rogues["token"], "tool:search")
            raise AssertionError("the rogue's revoked token of another tree was accepted by the tree-scoped verifier")
        except TreeNotFollowed as e:
            msg = str(e)
            assert ours.node_id in msg and "another tree" in msg and rogues["token"] not in msg, msg
        try:
            whole.authorize(rogues["token"], "tool:search")
            raise AssertionError("the rogue's revoked token was accepted by the whole feed's verifier")
        except GrantRevoked:
            pass
        scoped.authorize(own["token"], "tool:search")
    finally:
        scoped.close()
        whole.close()
