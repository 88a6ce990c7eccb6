package mcpgate

// SetMaxSeenNodesForTest sets the bound of the nodes whose seen reports
// the gateway keeps (a lineage's share is a quarter of it) until restore.
func SetMaxSeenNodesForTest(n int) (restore func()) {
	old := maxSeenNodes
	maxSeenNodes = n
	return func() { maxSeenNodes = old }
}

// BodyBytesHeldForTest is how many bytes of node's request bodies the
// gateway holds (being read, or their requests in flight).
func (g *Gateway) BodyBytesHeldForTest(node string) int64 {
	g.bodies.mu.Lock()
	defer g.bodies.mu.Unlock()
	return g.bodies.byNode[node]
}
