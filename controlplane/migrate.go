package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/tetherhq/tether/internal/store"
)

// SchemaVersion is the layout version of stored data. Stored records are
// protobuf messages, which evolve compatibly by field number; a layout change
// (a key moved or re-encoded) bumps this and adds a step to migrations.
const SchemaVersion = 1

var schemaKey = []byte("meta/schema_version")

// migrations[v] moves a store from version v to v+1.
var migrations = map[int]func(store.Txn) error{}

// migrate brings the store to SchemaVersion on start-up, one version per
// transaction, and refuses a store written by a newer server.
func migrate(ctx context.Context, st store.Store) error {
	for {
		var current int
		err := st.Update(ctx, func(tx store.Txn) error {
			v, err := tx.Get(schemaKey)
			switch {
			case errors.Is(err, store.ErrNotFound):
				current = SchemaVersion
				return tx.Put(schemaKey, []byte(strconv.Itoa(SchemaVersion)))
			case err != nil:
				return err
			}
			current, err = strconv.Atoi(string(v))
			if err != nil {
				return fmt.Errorf("controlplane: schema version %q: %w", v, err)
			}
			if current > SchemaVersion {
				return fmt.Errorf("controlplane: the store has schema version %d, newer than this server's %d", current, SchemaVersion)
			}
			if current == SchemaVersion {
				return nil
			}
			step, ok := migrations[current]
			if !ok {
				return fmt.Errorf("controlplane: no migration from schema version %d", current)
			}
			if err := step(tx); err != nil {
				return fmt.Errorf("controlplane: migrate from %d: %w", current, err)
			}
			current++
			return tx.Put(schemaKey, []byte(strconv.Itoa(current)))
		})
		if err != nil {
			return err
		}
		if current >= SchemaVersion {
			return nil
		}
	}
}
