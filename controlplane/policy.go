package controlplane

import (
	"github.com/tetherhq/tether/controlplane/auth"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

// Policy is who may call what. Every procedure of every service has a rule;
// a procedure without one is denied (and TestPolicyCoversEveryProcedure
// fails). Rules with Agents set are narrowed by the handler (own node,
// descendant, holder binding).
func Policy() auth.Policy {
	return auth.Policy{
		tetherv1connect.AuthServiceCreateTokenProcedure: auth.Admin,
		tetherv1connect.AuthServiceWhoAmIProcedure:      auth.Identity,
		tetherv1connect.AuthServiceRotateKeysProcedure:  auth.Admin,
		tetherv1connect.AuthServiceListKeysProcedure:    auth.ReadOperators,
		tetherv1connect.AuthServiceRevokeTokenProcedure: auth.Security,
		tetherv1connect.AuthServiceListTokensProcedure:  auth.Security,

		tetherv1connect.AgentServiceRegisterRootProcedure: auth.Operate,
		tetherv1connect.AgentServiceSpawnProcedure:        auth.OperateOrAgent,
		tetherv1connect.AgentServiceSpawnBatchProcedure:   auth.OperateOrAgent,
		tetherv1connect.AgentServiceSessionProcedure:      auth.Agent,
		tetherv1connect.AgentServiceConfirmExitProcedure:  auth.OperateOrAgent,
		tetherv1connect.AgentServiceGetNodeProcedure:      auth.Read,
		tetherv1connect.AgentServiceListNodesProcedure:    auth.Read,
		tetherv1connect.AgentServiceProposeStopProcedure:  auth.Agent,
		tetherv1connect.AgentServiceReportReadyProcedure:  auth.OperateOrAgent,
		// The session's halves for HTTP/1.1 clients: own node only.
		tetherv1connect.AgentServiceWatchSignalsProcedure: auth.Agent,
		tetherv1connect.AgentServiceHeartbeatProcedure:    auth.Agent,

		tetherv1connect.CapabilityServiceIssueRootProcedure:        auth.Operate,
		tetherv1connect.CapabilityServiceDelegateProcedure:         auth.OperateOrAgent,
		tetherv1connect.CapabilityServiceRefreshProcedure:          auth.OperateOrAgent,
		tetherv1connect.CapabilityServiceRevokeProcedure:           auth.Stop,
		tetherv1connect.CapabilityServiceGetGrantProcedure:         auth.Read,
		tetherv1connect.CapabilityServiceListGrantsProcedure:       auth.Read,
		tetherv1connect.CapabilityServiceIntrospectProcedure:       auth.Verify,
		tetherv1connect.CapabilityServiceWatchRevocationsProcedure: auth.Verify,

		// The tool layer reports tool calls, authenticated as a tool
		// server: an agent must not write evidence about its own calls, and
		// operators are not the tool layer.
		tetherv1connect.ToolServiceBeginCallProcedure:    auth.ToolLayer,
		tetherv1connect.ToolServiceEndCallProcedure:      auth.ToolLayer,
		tetherv1connect.ToolServiceCancelAckProcedure:    auth.ToolLayer,
		tetherv1connect.ToolServiceWatchCancelsProcedure: auth.ToolLayer,
		tetherv1connect.ToolServiceListCallsProcedure:    auth.ReadOperators,

		tetherv1connect.SupervisorServiceTerminateProcedure:         auth.Stop,
		tetherv1connect.SupervisorServiceGetTerminationProcedure:    auth.Read,
		tetherv1connect.SupervisorServiceWatchTerminationProcedure:  auth.Read,
		tetherv1connect.SupervisorServiceGetRecordProcedure:         auth.ReadOperators,
		tetherv1connect.SupervisorServiceListRecordsProcedure:       auth.ReadOperators,
		tetherv1connect.SupervisorServiceDecideProposalProcedure:    auth.Operate,
		tetherv1connect.SupervisorServiceListProposalsProcedure:     auth.ReadOperators,
		tetherv1connect.SupervisorServiceRegisterPrivilegeProcedure: auth.OperateOrAgent,
		tetherv1connect.SupervisorServiceListPrivilegesProcedure:    auth.ReadOperators,
		tetherv1connect.SupervisorServiceRolloutProcedure:           auth.Operate,
		tetherv1connect.SupervisorServiceGetRolloutProcedure:        auth.ReadOperators,
		tetherv1connect.SupervisorServiceListRolloutsProcedure:      auth.ReadOperators,
		tetherv1connect.SupervisorServiceWatchRolloutProcedure:      auth.ReadOperators,
		tetherv1connect.SupervisorServicePauseRolloutProcedure:      auth.Operate,
		tetherv1connect.SupervisorServiceResumeRolloutProcedure:     auth.Operate,
		tetherv1connect.SupervisorServiceAbortRolloutProcedure:      auth.Operate,

		// Stop rules: agents act on their own subtree (the handler and
		// supervisor/stoprule's attenuation rule check it); counters are
		// reported by the agent about itself only.
		tetherv1connect.StopRuleServiceAddStopRuleProcedure:    auth.OperateOrAgent,
		tetherv1connect.StopRuleServiceListStopRulesProcedure:  auth.Read,
		tetherv1connect.StopRuleServiceRemoveStopRuleProcedure: auth.OperateOrAgent,
		tetherv1connect.StopRuleServiceTestStopRuleProcedure:   auth.Read,
		tetherv1connect.StopRuleServiceReportCountersProcedure: auth.Agent,

		tetherv1connect.LeaseServiceOfferProcedure:         auth.OperateOrAgent,
		tetherv1connect.LeaseServiceAckProcedure:           auth.Agent,
		tetherv1connect.LeaseServiceRenewProcedure:         auth.Agent,
		tetherv1connect.LeaseServiceProgressProcedure:      auth.Agent,
		tetherv1connect.LeaseServiceRequestCancelProcedure: auth.OperateOrAgent,
		tetherv1connect.LeaseServiceCancelAckProcedure:     auth.Agent,
		tetherv1connect.LeaseServiceCompleteProcedure:      auth.Agent,
		tetherv1connect.LeaseServiceReassignProcedure:      auth.OperateOrAgent,
		tetherv1connect.LeaseServiceResolveProcedure:       auth.OperateOrAgent,
		tetherv1connect.LeaseServiceGetLeaseProcedure:      auth.ReadOrToolLayer,
		tetherv1connect.LeaseServiceListLeasesProcedure:    auth.Read,
		tetherv1connect.LeaseServiceEvidenceProcedure:      auth.Read,
		tetherv1connect.LeaseServiceGetPolicyProcedure:     auth.Read,
		tetherv1connect.LeaseServiceChannelProcedure:       auth.Agent,
	}
}
