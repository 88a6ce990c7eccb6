import type { Conn } from "./conn.js";
import type { Node } from "./gen/tether/v1/agent_pb.js";

/** What {@link listSubtree} lists. */
export interface ListSubtreeRequest {
  /** The subtree's root; empty (or absent): the calling agent's own subtree. */
  rootNodeId?: string;
  /** A label selector, "k=v,k2=v2"; empty matches all. */
  labelSelector?: string;
  /** Nodes read a call (the server's 1,000 at most and by default). */
  pageSize?: number;
  /** Where to resume: a next_page_token of an earlier page. */
  pageToken?: string;
}

/**
 * Lists a subtree whole (the calling agent's own when no root is named),
 * matching the label selector, depth first with each node's children in id
 * order, a page at a time: it asks for the subtree's pages (`ListNodes`
 * with `subtreePages`, pageSize nodes read a call) and follows their
 * `nextPageToken` to the end. `listNodes` with a root and without
 * `subtreePages` answers the subtree in one message, which a rogue in it
 * makes larger than the connection reads (`MaxMessageBytes`: about
 * 3,800 nodes carrying every label allowed) simply by spawning, so that its
 * parent's or an operator's listing of it fails; each page here is bounded
 * however large the subtree grew. Each page is its own snapshot, and each
 * is a request of the caller's rate budget. The Go SDK's
 * `agentsdk.ListSubtree`, the Python SDK's `list_subtree`.
 */
export async function listSubtree(conn: Conn, request: ListSubtreeRequest = {}, options: { signal?: AbortSignal } = {}): Promise<Node[]> {
  const out: Node[] = [];
  let token = request.pageToken ?? "";
  for (;;) {
    const resp = await conn.agent.listNodes(
      {
        rootNodeId: request.rootNodeId ?? "",
        labelSelector: request.labelSelector ?? "",
        pageSize: request.pageSize ?? 0,
        pageToken: token,
        subtreePages: true,
      },
      { signal: options.signal },
    );
    out.push(...resp.nodes);
    if (resp.nextPageToken === "") return out;
    if (resp.nextPageToken === token) {
      // A continuation that does not move on would be asked for for ever.
      throw new Error("listSubtree: the control plane answered the page it was asked for as the next one");
    }
    token = resp.nextPageToken;
  }
}
