package leader

import "context"

// Elector runs work while this replica leads.
type Elector interface {
	// Lead runs fn each time this replica becomes the leader, with a
	// context that ends when leadership is lost or ctx ends, and campaigns
	// again once fn has returned after a loss. It returns nil when ctx
	// ends, and fn's result when fn returns while this replica still leads
	// and ctx is live (the work is over, or failed).
	Lead(ctx context.Context, fn func(ctx context.Context) error) error
}

// Always is the Elector of a single replica: it always leads.
type Always struct{}

// Lead runs fn once, with ctx.
func (Always) Lead(ctx context.Context, fn func(ctx context.Context) error) error {
	err := fn(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}
