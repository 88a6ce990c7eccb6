package main

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// tether rule add|list|rm|test: stop rules (docs/stop-rules.md).
func newRuleCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "rule", Short: "Stop rules: CEL conditions that file a stop proposal when they become true"}
	cmd.AddCommand(newRuleAddCommand(g), newRuleListCommand(g), newRuleRemoveCommand(g), newRuleTestCommand(g))
	return cmd
}

func newRuleAddCommand(g *globals) *cobra.Command {
	var node, selector, name, action, severity, description string
	var labels []string
	cmd := &cobra.Command{
		Use:   "add EXPRESSION --name NAME (--node NODE | --selector k=v)",
		Short: "Attach a stop rule to a node's subtree (or, operators, by label selector)",
		Example: `  tether rule add --node n_… --name shell-budget --severity warning 'observed.calls_by_tool[?"shell"].orValue(0) > 200'
  tether rule add --selector team=research --name cost-cap --action abort 'self_reported.?cost_usd.orValue(0.0) > 25.0'`,
		Args: cobra.ExactArgs(1),
		RunE: g.dialed(func(cmd *cobra.Command, args []string, c *clients) error {
			ls := map[string]string{}
			for _, l := range labels {
				k, v, ok := strings.Cut(l, "=")
				if !ok {
					return fmt.Errorf("--label %q: want k=v", l)
				}
				ls[k] = v
			}
			resp, err := c.StopRule.AddStopRule(cmd.Context(), connect.NewRequest(&tetherv1.AddStopRuleRequest{
				NodeId: node, LabelSelector: selector, Name: name, Expression: args[0], Action: action,
				Severity: severity, Labels: ls, Description: description,
			}))
			if err != nil {
				return err
			}
			if err := carried("rule", "", "", resp.Msg.GetRule().GetRuleId() != ""); err != nil {
				return err
			}
			if done, err := g.printedAsJSON(cmd.OutOrStdout(), resp.Msg); done || err != nil {
				return err
			}
			printRule(cmd.OutOrStdout(), resp.Msg.Rule)
			fmt.Fprintf(cmd.OutOrStdout(), "cost:        at most %d of a budget of %d\n", resp.Msg.EstimatedCost, resp.Msg.CostBudget)
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&node, "node", "", "the node whose subtree the rule applies to")
	f.StringVar(&selector, "selector", "", "operators: every node with these labels (k=v,k2=v2)")
	f.StringVar(&name, "name", "", "the rule's name (unique among the rules in effect at the node)")
	f.StringVar(&action, "action", "propose", "what the rule suggests: propose, drain or abort (the operator's policy decides)")
	f.StringVar(&severity, "severity", "", "a severity the proposal policy can match (e.g. critical)")
	f.StringArrayVar(&labels, "label", nil, "a label k=v the proposal policy can match (repeatable)")
	f.StringVar(&description, "description", "", "why the rule exists")
	return cmd
}

func newRuleListCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list [NODE]",
		Short: "List the rules in effect at a node (its own and inherited), or every rule",
		Args:  cobra.MaximumNArgs(1),
		RunE: g.dialed(func(cmd *cobra.Command, args []string, c *clients) error {
			node := ""
			if len(args) == 1 {
				node = args[0]
			}
			// Every page (at most 500 rules each), then printed as one list.
			var rules []*tetherv1.StopRule
			token := ""
			for {
				resp, err := c.StopRule.ListStopRules(cmd.Context(), connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: node, PageToken: token}))
				if err != nil {
					return err
				}
				rules = append(rules, resp.Msg.Rules...)
				if token = resp.Msg.NextPageToken; token == "" {
					break
				}
			}
			return printList(g, cmd.OutOrStdout(), rules, "RULE\tNAME\tON\tSET BY\tACTION\tSEVERITY\tEXPRESSION", func(r *tetherv1.StopRule) []string {
				on := r.NodeId
				if on == "" {
					on = "selector " + selectorString(r.Selector)
				}
				if r.Inherited {
					on += " (inherited)"
				}
				return []string{r.RuleId, r.Name, on, r.SetBy, r.Action, orDash(r.Severity), r.Expression}
			})
		}),
	}
}

func newRuleRemoveCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm RULE",
		Short: "Remove a rule (agents: only rules they or their descendants set)",
		Args:  cobra.ExactArgs(1),
		RunE: g.dialed(func(cmd *cobra.Command, args []string, c *clients) error {
			resp, err := c.StopRule.RemoveStopRule(cmd.Context(), connect.NewRequest(&tetherv1.RemoveStopRuleRequest{RuleId: args[0]}))
			if err != nil {
				return err
			}
			if err := carried("rule", args[0], resp.Msg.GetRule().GetRuleId(), resp.Msg.GetRule().GetRuleId() != ""); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %s (%s)\n", printable(resp.Msg.Rule.RuleId), printable(resp.Msg.Rule.Name))
			return nil
		}),
	}
}

func newRuleTestCommand(g *globals) *cobra.Command {
	var ruleID string
	cmd := &cobra.Command{
		Use:   "test NODE [EXPRESSION | --rule RULE]",
		Short: "Evaluate an expression (or a stored rule) against a node's current observations, without acting",
		Args:  cobra.RangeArgs(1, 2),
		RunE: g.dialed(func(cmd *cobra.Command, args []string, c *clients) error {
			req := &tetherv1.TestStopRuleRequest{NodeId: args[0], RuleId: ruleID}
			if len(args) == 2 {
				req.Expression = args[1]
			}
			resp, err := c.StopRule.TestStopRule(cmd.Context(), connect.NewRequest(req))
			if err != nil {
				return err
			}
			if done, err := g.printedAsJSON(cmd.OutOrStdout(), resp.Msg); done || err != nil {
				return err
			}
			// The error names what the expression read (a map's key an
			// agent chose): printed as any agent's text is.
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "result:  %v (cost %d)\n", resp.Msg.Result, resp.Msg.Cost)
			if resp.Msg.Error != "" {
				fmt.Fprintf(w, "error:   %s (a rule whose evaluation fails does not fire)\n", printable(resp.Msg.Error))
			}
			printValues(w, resp.Msg.Values)
			return nil
		}),
	}
	cmd.Flags().StringVar(&ruleID, "rule", "", "evaluate this stored rule")
	return cmd
}

func printRule(w io.Writer, r *tetherv1.StopRule) {
	on := r.NodeId
	if on == "" {
		on = "selector " + selectorString(r.Selector)
	}
	fmt.Fprintf(w, "rule_id:     %s\nname:        %s\non:          %s\nset_by:      %s\naction:      %s\nseverity:    %s\nexpression:  %s\n",
		printable(r.RuleId), printable(r.Name), printable(on), printable(r.SetBy), printable(r.Action), printable(orDash(r.Severity)), printable(r.Expression))
}

// printValues lists the values a rule read, self-reported ones labelled.
func printValues(w io.Writer, vs []*tetherv1.StopRuleValue) {
	for _, v := range vs {
		tag := ""
		if v.SelfReported {
			tag = "  (self-reported)"
		}
		fmt.Fprintf(w, "  %s = %s%s\n", printable(v.Name), printable(v.Value), tag)
	}
}

func selectorString(sel map[string]string) string {
	parts := make([]string, 0, len(sel))
	for k, v := range sel {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}
