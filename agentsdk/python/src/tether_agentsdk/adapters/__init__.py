"""Adapters for agent frameworks (optional extras):

- ``tether_agentsdk.adapters.openai_agents`` for ``openai-agents``;
- ``tether_agentsdk.adapters.langgraph`` for ``langgraph``.

Each does three things: every tool call goes through a ToolGate (recorded,
refused while the subtree drains, cancelled on abort); a sub-agent (a
handoff, an agent used as a tool, a subgraph) becomes a spawned child node
with an attenuated grant; and the run is cancelled when its subtree is
aborted.
"""
