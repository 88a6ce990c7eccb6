package main

import (
	"errors"
	"regexp"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
)

// flagOfField maps a request field, as the server names it in an
// InvalidArgument message, to the flag a user typed. A mapping applies
// only to a command that has that flag.
var flagOfField = map[string]string{
	"holder_node_id":     "--holder",
	"holder_identity":    "--holder",
	"parent_node_id":     "--parent",
	"parent_grant_id":    "--from",
	"subtree_node_id":    "--subtree",
	"root_node_id":       "--root",
	"scopes":             "--scope",
	"scope":              "--scope",
	"ttl":                "--ttl",
	"name":               "--name",
	"labels":             "--label",
	"label_selector":     "--selector",
	"drain_window":       "--window",
	"cancel_ack_timeout": "--cancel-ack-timeout",
	"confirm_timeout":    "--confirm-timeout",
	"ack_timeout":        "--ack-timeout",
	"duration":           "--duration",
	"lease_id":           "--lease-id",
	"generation":         "--generation",
	"sequence":           "--sequence",
	"reason":             "--reason",
	"tool_server":        "--tool-server",
	"issued_before":      "--issued-before",
	"mode":               "--mode",
	"role":               "--role",
}

// argOfField maps a field to the positional argument that carries it, by
// the placeholder in the command's usage line (terminate NODE).
var argOfField = map[string]string{
	"node_id":        "NODE",
	"grant_id":       "GRANT",
	"job_id":         "JOB",
	"termination_id": "ID",
	"record_id":      "ID",
}

// A field name starts the message or follows ": " or "; ", as the
// server's messages put it ("holder_node_id is required").
var fieldInMessage = regexp.MustCompile(`(^|: |; )([a-z][a-z_]*)\b`)

// inUserVocabulary rewrites an InvalidArgument error from the server so
// that it names the flags and arguments of the command the user ran
// instead of the request's proto fields. Other errors pass unchanged.
func inUserVocabulary(cmd *cobra.Command, err error) error {
	var ce *connect.Error
	if cmd == nil || !errors.As(err, &ce) || ce.Code() != connect.CodeInvalidArgument {
		return err
	}
	usage := " " + cmd.Use + " "
	msg := fieldInMessage.ReplaceAllStringFunc(ce.Message(), func(m string) string {
		sub := fieldInMessage.FindStringSubmatch(m)
		lead, field := sub[1], sub[2]
		if flag, ok := flagOfField[field]; ok && cmd.Flags().Lookup(strings.TrimPrefix(flag, "--")) != nil {
			return lead + flag
		}
		if arg, ok := argOfField[field]; ok && strings.Contains(usage, " "+arg+" ") {
			return lead + arg
		}
		return m
	})
	if msg == ce.Message() {
		return err
	}
	return connect.NewError(ce.Code(), errors.New(msg))
}
