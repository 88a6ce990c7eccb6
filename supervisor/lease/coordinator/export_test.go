package coordinator

// ShardOf is the shard that owns job.
func (c *Coordinator) ShardOf(job string) int { return c.shardOf(job).index }

// QueuedBatches is how many sealed batches wait for the committer.
func (c *Coordinator) QueuedBatches() int { return len(c.commitQueue) }
