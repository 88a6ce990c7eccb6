package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/tetherhq/tether/controlplane/store"
	"github.com/tetherhq/tether/internal/clock"
	"github.com/tetherhq/tether/internal/id"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Privilege outcomes, as they appear in the record.
const (
	OutcomeRevoked      = "revoked"
	OutcomeExpired      = "expired"
	OutcomeRevokeFailed = "revoke_failed"
)

// Privilege is a temporary privilege held by a node outside Tether — a file
// lock, a queue reservation, a cloud credential — registered so that a
// termination revokes it.
type Privilege struct {
	ID         string    `json:"privilege_id"`
	NodeID     string    `json:"node_id"`
	GrantID    string    `json:"grant_id,omitempty"`
	Kind       string    `json:"kind"`
	ExternalID string    `json:"external_id"`
	ExpiresAt  time.Time `json:"expires_at"`
	RevokeURL  string    `json:"revoke_url,omitempty"`
	// Outcome is set once, when a termination dealt with the privilege.
	Outcome   string    `json:"outcome,omitempty"`
	Error     string    `json:"error,omitempty"`
	DecidedAt time.Time `json:"decided_at,omitzero"`
}

// PrivilegeRevoker revokes privileges of one kind in process.
type PrivilegeRevoker interface {
	RevokePrivilege(ctx context.Context, p Privilege) error
}

// PrivilegeRevokerFunc adapts a function.
type PrivilegeRevokerFunc func(ctx context.Context, p Privilege) error

// RevokePrivilege calls f.
func (f PrivilegeRevokerFunc) RevokePrivilege(ctx context.Context, p Privilege) error {
	return f(ctx, p)
}

// Privileges is the registry of temporary privileges and their revocation
// handlers: in-process revokers by kind, or an HTTP webhook per privilege.
type Privileges struct {
	Store    store.Store
	Clock    clock.Clock
	Handlers map[string]PrivilegeRevoker
	HTTP     *http.Client
}

// Register records a privilege held by a running node.
func (r *Privileges) Register(ctx context.Context, p Privilege) (Privilege, error) {
	if err := id.Check(id.Node, "node_id", p.NodeID); err != nil {
		return p, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if !toolPattern.MatchString(p.Kind) {
		return p, fmt.Errorf("%w: kind must be 1-128 characters of letters, digits and . _ : / -", ErrInvalidArgument)
	}
	if p.ExternalID == "" || len(p.ExternalID) > 512 {
		return p, fmt.Errorf("%w: external_id must be 1-512 bytes", ErrInvalidArgument)
	}
	if p.ExpiresAt.IsZero() || !p.ExpiresAt.After(r.Clock.Now()) {
		return p, fmt.Errorf("%w: expires_at must be in the future", ErrInvalidArgument)
	}
	if p.RevokeURL != "" {
		u, err := url.Parse(p.RevokeURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return p, fmt.Errorf("%w: revoke_url must be an http or https URL", ErrInvalidArgument)
		}
	} else if _, ok := r.Handlers[p.Kind]; !ok {
		return p, fmt.Errorf("%w: kind %q has no revocation handler; give a revoke_url", ErrInvalidArgument, p.Kind)
	}
	p.ID = id.New(id.Privilege)
	p.Outcome, p.Error = "", ""
	err := r.Store.Update(ctx, func(tx store.Txn) error {
		n, err := getNode(tx, p.NodeID)
		if err != nil {
			return err
		}
		if n.State != tetherv1.NodeState_NODE_STATE_RUNNING {
			return fmt.Errorf("%w: node_id %s is %s", ErrParentNotRunning, p.NodeID, StateName(n.State))
		}
		if err := putJSON(tx, privilegeKey(p.ID), p); err != nil {
			return err
		}
		return tx.Put(nodePrivKey(p.NodeID, p.ID), nil)
	})
	return p, err
}

// PrivilegesIn lists the privileges of the nodes.
func PrivilegesIn(tx store.ReadTxn, nodeIDs []string) ([]Privilege, error) {
	if err := store.Prefetch(tx, nil, keysOf(nodeIDs, nodePrivPrefix)); err != nil {
		return nil, err
	}
	var out []Privilege
	for _, n := range nodeIDs {
		var ids []string
		p := nodePrivPrefix(n)
		if err := tx.Scan(p, nil, func(k, _ []byte) error {
			ids = append(ids, string(k[len(p):]))
			return nil
		}); err != nil {
			return nil, err
		}
		for _, pid := range ids {
			var priv Privilege
			if err := getJSON(tx, privilegeKey(pid), &priv); err != nil {
				return nil, err
			}
			out = append(out, priv)
		}
	}
	return out, nil
}

// RevokeFor revokes every undecided privilege of the nodes and persists each
// outcome as it is decided, so a restart never calls a handler twice for a
// decided privilege. A privilege past its expiry is recorded expired
// without calling anything.
func (r *Privileges) RevokeFor(ctx context.Context, nodeIDs []string) error {
	var privs []Privilege
	if err := r.Store.View(ctx, func(tx store.ReadTxn) error {
		var err error
		privs, err = PrivilegesIn(tx, nodeIDs)
		return err
	}); err != nil {
		return err
	}
	for _, p := range privs {
		if p.Outcome != "" {
			continue
		}
		now := r.Clock.Now()
		switch {
		case !now.Before(p.ExpiresAt):
			p.Outcome = OutcomeExpired
		default:
			if err := r.revoke(ctx, p); err != nil {
				p.Outcome, p.Error = OutcomeRevokeFailed, err.Error()
			} else {
				p.Outcome = OutcomeRevoked
			}
		}
		p.DecidedAt = now
		if err := r.Store.Update(ctx, func(tx store.Txn) error { return putJSON(tx, privilegeKey(p.ID), p) }); err != nil {
			return err
		}
	}
	return nil
}

func (r *Privileges) revoke(ctx context.Context, p Privilege) error {
	if h, ok := r.Handlers[p.Kind]; ok && p.RevokeURL == "" {
		return h.RevokePrivilege(ctx, p)
	}
	if p.RevokeURL == "" {
		return errors.New("no revocation handler")
	}
	body, _ := json.Marshal(map[string]string{
		"privilege_id": p.ID, "kind": p.Kind, "external_id": p.ExternalID, "node_id": p.NodeID, "grant_id": p.GrantID,
	})
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.RevokeURL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	hc := r.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("webhook unreachable")
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("webhook answered %d", resp.StatusCode)
	}
	return nil
}

func putJSON(tx store.Txn, key []byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return tx.Put(key, b)
}

func getJSON(tx store.ReadTxn, key []byte, v any) error {
	b, err := tx.Get(key)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
