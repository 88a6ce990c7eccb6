package main

import (
	"errors"
	"testing"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
)

func findCommand(t *testing.T, args ...string) *cobra.Command {
	t.Helper()
	cmd, _, err := newRootCommand().Find(args)
	if err != nil {
		t.Fatal(err)
	}
	return cmd
}

// The CLI names the flags the user typed, not the request's fields, and
// only where the command has that flag.
func TestErrorsNameFlagsNotFields(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code connect.Code
		msg  string
		want string
	}{
		{[]string{"grant", "root"}, connect.CodeInvalidArgument, "grantstore: invalid argument: holder_node_id is required", "grantstore: invalid argument: --holder is required"},
		{[]string{"grant", "delegate"}, connect.CodeInvalidArgument, `parent_grant_id "x" is not a grant id (g_ and 20 characters)`, `--from "x" is not a grant id (g_ and 20 characters)`},
		{[]string{"grant", "root"}, connect.CodeInvalidArgument, "capability: invalid ttl: ttl -1s is out of range", "capability: invalid ttl: --ttl -1s is out of range"},
		{[]string{"terminate"}, connect.CodeInvalidArgument, `supervisor: invalid argument: node_id "x" is not a node id (n_ and 20 characters)`, `supervisor: invalid argument: NODE "x" is not a node id (n_ and 20 characters)`},
		{[]string{"lease", "offer"}, connect.CodeInvalidArgument, `holder_identity "x" is not a node id`, `--holder "x" is not a node id`},
		// agent spawn has no --holder: the field stays as the server said it.
		{[]string{"agent", "spawn"}, connect.CodeInvalidArgument, "holder_node_id is required", "holder_node_id is required"},
		// Only InvalidArgument messages are about the request's fields.
		{[]string{"grant", "root"}, connect.CodePermissionDenied, "holder_node_id is not yours", "holder_node_id is not yours"},
	} {
		err := inUserVocabulary(findCommand(t, tc.args...), connect.NewError(tc.code, errors.New(tc.msg)))
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Message() != tc.want || ce.Code() != tc.code {
			t.Errorf("tether %v, %q: got %v; want %s: %q", tc.args, tc.msg, err, tc.code, tc.want)
		}
	}
}
