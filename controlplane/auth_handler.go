package controlplane

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/auth"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
	"github.com/tetherhq/tether/proto/tether/v1/tetherv1connect"
)

type authService struct {
	tetherv1connect.UnimplementedAuthServiceHandler
	s *Server
}

// MaxOperatorTokenTTL bounds operator tokens minted through the API.
const MaxOperatorTokenTTL = 366 * 24 * time.Hour

var roleFromProto = map[tetherv1.Role]auth.Role{
	tetherv1.Role_ROLE_VIEWER:   auth.RoleViewer,
	tetherv1.Role_ROLE_OPERATOR: auth.RoleOperator,
	tetherv1.Role_ROLE_SECURITY: auth.RoleSecurity,
	tetherv1.Role_ROLE_ADMIN:    auth.RoleAdmin,
}

func roleToProto(r auth.Role) tetherv1.Role {
	for k, v := range roleFromProto {
		if v == r {
			return k
		}
	}
	return tetherv1.Role_ROLE_UNSPECIFIED
}

func (a *authService) CreateToken(ctx context.Context, req *connect.Request[tetherv1.CreateTokenRequest]) (*connect.Response[tetherv1.CreateTokenResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	if req.Msg.ToolServer != "" {
		return a.createToolServerToken(ctx, p, req.Msg)
	}
	role, ok := roleFromProto[req.Msg.Role]
	if !ok {
		return nil, invalid("role is required: one of ROLE_VIEWER, ROLE_OPERATOR, ROLE_SECURITY, ROLE_ADMIN")
	}
	ttl := req.Msg.GetTtl().AsDuration()
	if req.Msg.Ttl == nil || ttl == 0 {
		ttl = a.s.cfg.OperatorTokenTTL
	}
	if ttl <= 0 || ttl > MaxOperatorTokenTTL {
		return nil, invalid("ttl %s is out of range: want more than 0s and at most %s", ttl, MaxOperatorTokenTTL)
	}
	subject := req.Msg.Subject
	if subject == "" {
		subject = role.String()
	}
	if !namePattern.MatchString(subject) {
		return nil, invalid("subject must be 1-63 characters of letters, digits, '.', '_' or '-'")
	}
	// Only for a caller whose token the store does not say is revoked
	// (this replica's feed may not have it yet).
	if err := a.s.mintableBy(ctx, p); err != nil {
		return nil, err
	}
	token, tokenID, exp, err := a.s.authn.MintOperator(subject, role, a.s.cfg.Clock.Now(), ttl)
	if err != nil {
		return nil, toConnect(err)
	}
	// Recorded before it is handed out: a token nobody can list or revoke
	// is never returned.
	if _, err := a.s.recordToken(ctx, token, p.ID()); err != nil {
		return nil, toConnect(err)
	}
	a.s.log.Info("operator token created", "by", p.ID(), "subject", subject, "role", role.String(), "token_id", tokenID)
	return connect.NewResponse(&tetherv1.CreateTokenResponse{Token: token, TokenId: tokenID, ExpiresAt: timestamppb.New(exp)}), nil
}

// createToolServerToken mints a tool server's token: its name is its gate
// id in the ledger, and it may call only ToolService (and WhoAmI).
func (a *authService) createToolServerToken(ctx context.Context, p auth.Principal, msg *tetherv1.CreateTokenRequest) (*connect.Response[tetherv1.CreateTokenResponse], error) {
	if msg.Role != tetherv1.Role_ROLE_UNSPECIFIED {
		return nil, invalid("role and tool_server are exclusive: a token is an operator's (role) or a tool server's (tool_server), not both")
	}
	if msg.Subject != "" && msg.Subject != msg.ToolServer {
		return nil, invalid("subject must be empty for a tool-server token (its subject is tool_server)")
	}
	if !namePattern.MatchString(msg.ToolServer) {
		return nil, invalid("tool_server must be 1-63 characters of letters, digits, '.', '_' or '-', starting with a letter or digit")
	}
	ttl := msg.GetTtl().AsDuration()
	if msg.Ttl == nil {
		ttl = 24 * time.Hour
	}
	if ttl <= 0 || ttl > MaxOperatorTokenTTL {
		return nil, invalid("ttl %s is out of range: want more than 0s and at most %s", ttl, MaxOperatorTokenTTL)
	}
	if err := a.s.mintableBy(ctx, p); err != nil {
		return nil, err
	}
	token, tokenID, exp, err := a.s.authn.MintToolServer(msg.ToolServer, a.s.cfg.Clock.Now(), ttl)
	if err != nil {
		return nil, toConnect(err)
	}
	// Recorded before it is handed out, as an operator's: a tool server's
	// token reports calls to the ledger for a year perhaps, and one nobody
	// can list or revoke by id (minted with an admin token since rotated)
	// would outlive every recovery but a key rotation.
	if _, err := a.s.recordToken(ctx, token, p.ID()); err != nil {
		return nil, toConnect(err)
	}
	a.s.log.Info("tool-server token created", "by", p.ID(), "tool_server", msg.ToolServer, "token_id", tokenID)
	return connect.NewResponse(&tetherv1.CreateTokenResponse{Token: token, TokenId: tokenID, ExpiresAt: timestamppb.New(exp)}), nil
}

func (a *authService) WhoAmI(ctx context.Context, _ *connect.Request[tetherv1.WhoAmIRequest]) (*connect.Response[tetherv1.WhoAmIResponse], error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&tetherv1.WhoAmIResponse{
		Principal: p.ID(),
		Role:      roleToProto(p.Role),
		NodeId:    p.NodeID(),
		ExpiresAt: timestamppb.New(p.ExpiresAt),
	}), nil
}
