package mcpgate

// SetMaxSeenNodesForTest sets the bound of the nodes whose seen reports
// the gateway keeps (a lineage's share is a quarter of it) until restore.
func SetMaxSeenNodesForTest(n int) (restore func()) {
	old := maxSeenNodes
	maxSeenNodes = n
	return func() { maxSeenNodes = old }
}
