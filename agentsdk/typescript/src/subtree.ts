import { createHash } from "node:crypto";

import type { Conn } from "./conn.js";
import type { Node } from "./gen/tether/v1/agent_pb.js";

/**
 * The most answers {@link listSubtree} follows `nextPageToken` through: at
 * the server's largest pages 10 million nodes, far past what a caller holds
 * in memory (a caller of a larger subtree pages it itself, from the last
 * token it read). A path that answers a fresh token with every page is read
 * no further. The Go SDK's `agentsdk.MaxPages`.
 */
export const MaxPages = 10_000;

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
 *
 * A page the control plane never answers rejects with an error: one of more
 * nodes than pageSize (or 1,000), a `nextPageToken` answered before (the
 * control plane's continuation always moves on: a path to it, a rogue proxy
 * or replica, that repeats, alternates or cycles its pages would be read
 * for ever), a listing past {@link MaxPages} answers.
 */
export async function listSubtree(conn: Conn, request: ListSubtreeRequest = {}, options: { signal?: AbortSignal } = {}): Promise<Node[]> {
  const out: Node[] = [];
  const size = request.pageSize ?? 0;
  const most = size > 0 && size < 1000 ? size : 1000;
  let token = request.pageToken ?? "";
  const seen = new Set<string>();
  const sum = (t: string): string => createHash("sha256").update(t).digest("base64");
  if (token !== "") seen.add(sum(token));
  for (let pages = 1; ; pages++) {
    const resp = await conn.agent.listNodes(
      {
        rootNodeId: request.rootNodeId ?? "",
        labelSelector: request.labelSelector ?? "",
        pageSize: size,
        pageToken: token,
        subtreePages: true,
      },
      { signal: options.signal },
    );
    if (resp.nodes.length > most) {
      throw new Error(`listSubtree: a page of ${resp.nodes.length} nodes, where the control plane's hold at most ${most}`);
    }
    out.push(...resp.nodes);
    if (resp.nextPageToken === "") return out;
    // A continuation that does not move on (the page asked for, or any
    // earlier one) would be asked for for ever.
    const key = sum(resp.nextPageToken);
    if (seen.has(key)) {
      throw new Error(`listSubtree: answer ${pages} named a page already read as the next (the control plane's pages always move on: a path to it repeats or cycles them)`);
    }
    if (pages >= MaxPages) {
      throw new Error(`listSubtree: still a next page after ${pages} answers (MaxPages); read the rest a page at a time`);
    }
    seen.add(key);
    token = resp.nextPageToken;
  }
}
