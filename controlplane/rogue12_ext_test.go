package controlplane_test

import (
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/controlplane/testserver"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// rogue12World: a rogue root with a grant of its own and a child, and a
// victim tree (root, a running child holding a grant, a draining child).
type rogue12World struct {
	srv                        *testserver.Server
	admin, rogue               *testserver.Clients
	rogueID, rogueChild        string
	rogueGrant                 held
	victim, running, draining  string
	victimCred                 string
	victimGrant, victimGrantOf held
}

func newRogue12World(t *testing.T) *rogue12World {
	t.Helper()
	srv := testserver.Start(t)
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	rc := srv.Clients(rogue.Credential)
	child := spawn(t, rc, rogue.Node.NodeId, "rogue-child")
	victim := register(t, admin, "victim")
	vc := srv.Clients(victim.Credential)
	running := spawn(t, vc, victim.Node.NodeId, "running")
	draining := spawn(t, vc, victim.Node.NodeId, "draining")
	w := &rogue12World{
		srv: srv, admin: admin, rogue: rc, rogueID: rogue.Node.NodeId, rogueChild: child.Node.NodeId,
		rogueGrant: issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:*"),
		victimCred: victim.Credential,
		victim:     victim.Node.NodeId, running: running.Node.NodeId, draining: draining.Node.NodeId,
		victimGrant:   issueRoot(t, admin, victim.Node.NodeId, time.Hour, "tool:*"),
		victimGrantOf: issueRoot(t, admin, running.Node.NodeId, time.Hour, "tool:*"),
	}
	terminate(t, admin, draining.Node.NodeId, tetherv1.TerminationMode_TERMINATION_MODE_DRAIN, time.Hour, time.Hour, time.Hour)
	return w
}

// wantNoOtherTreesIDs fails when err names an id of the victim's tree
// other than the one the rogue asked about.
func (w *rogue12World) wantNoOtherTreesIDs(t *testing.T, what string, err error, asked string) {
	t.Helper()
	if err == nil {
		return
	}
	for _, id := range []string{w.victimGrant.grant.GrantId, w.victimGrantOf.grant.GrantId, w.victim, w.running, w.draining} {
		if id != asked && strings.Contains(err.Error(), id) {
			t.Errorf("%s: the refusal %q names %s, an id of another tree the rogue did not give", what, err, id)
		}
	}
}

// A rogue cannot sweep other trees' grants with issued_before: an agent's
// Revoke by issue time used to read every grant of the server issued
// before the time and, on the first one it may not revoke, answer
// permission_denied naming that grant — so by moving the time the rogue
// enumerated other trees' grant ids and when each was issued (and with no
// grant in the way, it answered OK). Revoking by issue time is an
// operator's tool (a compromised key); an agent is refused before anything
// is read, and names nothing.
func TestARogueCannotEnumerateOtherTreesGrantsByIssueTime(t *testing.T) {
	w := newRogue12World(t)
	ctx := context.Background()
	now := w.srv.Clock.Now()
	for _, at := range []time.Time{now.Add(-time.Hour), now.Add(time.Hour)} {
		_, err := w.rogue.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_IssuedBefore{IssuedBefore: timestamppb.New(at)}}))
		if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "issued_before") {
			t.Errorf("an agent's revoke of every grant issued before %s: %v, want permission_denied naming issued_before", at, err)
		}
		w.wantNoOtherTreesIDs(t, "issued_before", err, "")
		if err != nil && strings.Contains(err.Error(), "g_") {
			t.Errorf("issued_before: the refusal %q names a grant", err)
		}
	}
	for _, h := range []held{w.victimGrant, w.victimGrantOf, w.rogueGrant} {
		if got := introspect(t, w.admin, h.token); !got.Active {
			t.Errorf("%s was revoked by the rogue's sweep: %s", h.grant.GrantId, got.Reason)
		}
	}
}

// A rogue that names another tree's node in a Revoke by holder or by
// subtree learns nothing of it: the request used to answer OK (nothing
// revoked) for a node holding no active grant and permission_denied
// naming the grant for one that holds one — which node holds grants, and
// their ids. Now a node outside the rogue's subtree is refused alike
// whatever it holds and whatever its state, naming only the node, and a
// node of its own subtree is revoked as before.
func TestARogueCannotLearnAnotherTreesGrantsByRevokingItsNodes(t *testing.T) {
	w := newRogue12World(t)
	ctx := context.Background()
	var answers []string
	for _, node := range []string{w.victim, w.running, w.draining} {
		for _, target := range []*tetherv1.RevokeRequest{
			{Target: &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: node}},
			{Target: &tetherv1.RevokeRequest_SubtreeNodeId{SubtreeNodeId: node}},
		} {
			_, err := w.rogue.Capability.Revoke(ctx, connect.NewRequest(target))
			if connect.CodeOf(err) != connect.CodePermissionDenied {
				t.Errorf("revoke %v of another tree's node: %v, want permission_denied", target.Target, err)
				continue
			}
			w.wantNoOtherTreesIDs(t, "revoke by node", err, node)
			answers = append(answers, strings.ReplaceAll(err.Error(), node, "N"))
		}
	}
	for i := 2; i < len(answers); i++ {
		if answers[i] != answers[i%2] {
			t.Errorf("the refusal for one node %q differs from another's %q (it tells their grants or state apart)", answers[i], answers[i%2])
		}
	}
	for _, h := range []held{w.victimGrant, w.victimGrantOf} {
		if got := introspect(t, w.admin, h.token); !got.Active {
			t.Errorf("%s was revoked by the rogue", h.grant.GrantId)
		}
	}
	// Its own subtree still revokes.
	mine := delegate(t, w.rogue, w.rogueGrant, w.rogueChild, "tool:x")
	res, err := w.rogue.Capability.Revoke(ctx, connect.NewRequest(&tetherv1.RevokeRequest{Target: &tetherv1.RevokeRequest_HolderNodeId{HolderNodeId: w.rogueChild}}))
	if err != nil || len(res.Msg.RevokedGrantIds) != 1 || res.Msg.RevokedGrantIds[0] != mine.grant.GrantId {
		t.Fatalf("the rogue revoking its own child's grant: %v %v", res, err)
	}
}

// A rogue that delegates to another tree's node learns nothing of its
// state: the request used to answer permission_denied for a running node
// and failed_precondition naming the state ("is draining") for one being
// stopped. Now the node is refused as not a descendant first, the same
// way whatever its state, and nothing is issued.
func TestARogueCannotLearnAnotherTreesNodeStateByDelegatingToIt(t *testing.T) {
	w := newRogue12World(t)
	ctx := context.Background()
	var answers []string
	for _, node := range []string{w.victim, w.running, w.draining} {
		_, err := w.rogue.Capability.Delegate(ctx, connect.NewRequest(&tetherv1.DelegateRequest{ParentGrantId: w.rogueGrant.grant.GrantId, HolderNodeId: node, Scopes: []string{"tool:x"}}))
		if connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("delegating to another tree's node: %v, want permission_denied", err)
			continue
		}
		w.wantNoOtherTreesIDs(t, "delegate", err, node)
		answers = append(answers, strings.ReplaceAll(err.Error(), node, "N"))
	}
	for _, a := range answers {
		if a != answers[0] {
			t.Errorf("the refusals differ by the node's state: %q and %q", answers[0], a)
		}
	}
	got, err := w.admin.Capability.ListGrants(ctx, connect.NewRequest(&tetherv1.ListGrantsRequest{DerivedFromGrantId: w.rogueGrant.grant.GrantId}))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range got.Msg.Grants {
		if g.GrantId != w.rogueGrant.grant.GrantId {
			t.Errorf("the rogue's refused delegations issued %s to %s", g.GrantId, g.HolderNodeId)
		}
	}
}

// forgeJWT builds a compact JWS from a header and claims; sign makes the
// signature of the signing input (nil: no signature).
func forgeJWT(t *testing.T, header, claims map[string]any, sign func(input []byte) []byte) string {
	t.Helper()
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	input := enc(header) + "." + enc(claims)
	var sig []byte
	if sign != nil {
		sig = sign([]byte(input))
	}
	return input + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// swapPayload keeps a real token's header and signature and replaces its
// claims with edit's result.
func swapPayload(t *testing.T, token string, edit func(map[string]any)) string {
	t.Helper()
	parts := strings.Split(token, ".")
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims map[string]any
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Fatal(err)
	}
	edit(claims)
	b, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	return parts[0] + "." + base64.RawURLEncoding.EncodeToString(b) + "." + parts[2]
}

// A rogue that forges tokens from what it can see — the server's public
// keys (JWKS), its own credential and capability token — gets none of
// them accepted: not as a credential (alg none, HS256 keyed with the
// public key, its own Ed25519 key under the server's kid or in an
// embedded jwk, its own credential re-labelled an admin operator's, a
// future-dated or century-long copy of its claims, a kid of no key, a
// duplicated audience) and not as a capability token (its own token with
// wider scopes or another holder). Held (no fix): Tether's parsers accept
// only EdDSA verified by a key of the ring named by kid, with one encoding
// per token; this guards it.
func TestARogueCannotForgeACredentialOrATokenFromWhatItSees(t *testing.T) {
	srv := testserver.Start(t)
	ctx := context.Background()
	admin := srv.AdminClients()
	rogue := register(t, admin, "rogue")
	rc := srv.Clients(rogue.Credential)
	victim := register(t, admin, "victim")
	mine := issueRoot(t, admin, rogue.Node.NodeId, time.Hour, "tool:read")

	resp, err := srv.HTTP.Get(srv.URL + "/.well-known/jwks.json")
	if err != nil {
		t.Fatal(err)
	}
	var jwks struct {
		Keys []struct{ Kid, X string } `json:"keys"`
	}
	err = json.NewDecoder(resp.Body).Decode(&jwks)
	resp.Body.Close()
	if err != nil || len(jwks.Keys) == 0 {
		t.Fatalf("jwks: %v %v", err, jwks)
	}
	kid := jwks.Keys[0].Kid
	public, err := base64.RawURLEncoding.DecodeString(jwks.Keys[0].X)
	if err != nil {
		t.Fatal(err)
	}
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	now := srv.Clock.Now()
	operator := map[string]any{"iss": "tether", "sub": "admin", "aud": []string{"tether-operator"}, "role": "admin",
		"exp": now.Add(time.Hour).Unix(), "nbf": now.Add(-time.Second).Unix(), "iat": now.Unix(), "jti": "forged"}
	// The issuer the server really uses.
	swapPayload(t, rogue.Credential, func(c map[string]any) { operator["iss"] = c["iss"] })
	hs256 := func(input []byte) []byte { m := hmac.New(sha256.New, public); m.Write(input); return m.Sum(nil) }
	ed := func(input []byte) []byte { return ed25519.Sign(priv, input) }
	forged := map[string]string{
		"alg none":                              forgeJWT(t, map[string]any{"alg": "none", "typ": "JWT"}, operator, nil),
		"alg none with the server's kid":        forgeJWT(t, map[string]any{"alg": "none", "kid": kid}, operator, nil),
		"HS256 keyed with the public key":       forgeJWT(t, map[string]any{"alg": "HS256", "kid": kid}, operator, hs256),
		"its own Ed25519 key under the kid":     forgeJWT(t, map[string]any{"alg": "EdDSA", "kid": kid}, operator, ed),
		"its own key in an embedded jwk":        forgeJWT(t, map[string]any{"alg": "EdDSA", "jwk": map[string]any{"kty": "OKP", "crv": "Ed25519", "x": base64.RawURLEncoding.EncodeToString(pub)}}, operator, ed),
		"a kid of no key":                       forgeJWT(t, map[string]any{"alg": "EdDSA", "kid": "k_retired"}, operator, ed),
		"its credential re-labelled an admin":   swapPayload(t, rogue.Credential, func(c map[string]any) { c["aud"], c["role"] = []string{"tether-operator"}, "admin" }),
		"its credential as the victim's node":   swapPayload(t, rogue.Credential, func(c map[string]any) { c["sub"] = victim.Node.NodeId }),
		"its credential dated in the future":    swapPayload(t, rogue.Credential, func(c map[string]any) { c["nbf"], c["iat"] = now.Add(time.Hour).Unix(), now.Add(time.Hour).Unix() }),
		"its credential for a century":          swapPayload(t, rogue.Credential, func(c map[string]any) { c["exp"] = now.AddDate(100, 0, 0).Unix() }),
		"its credential with two audiences":     swapPayload(t, rogue.Credential, func(c map[string]any) { c["aud"] = []string{"tether-agent", "tether-operator"} }),
		"its credential's signature re-encoded": reencodeSignature(rogue.Credential),
	}
	for what, token := range forged {
		if token == rogue.Credential {
			continue
		}
		_, err := srv.Clients(token).Auth.WhoAmI(ctx, connect.NewRequest(&tetherv1.WhoAmIRequest{}))
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("%s as a credential: %v, want unauthenticated", what, err)
		}
		if err != nil && strings.Contains(err.Error(), token) {
			t.Errorf("%s: the refusal quotes the token", what)
		}
	}
	// Capability tokens, shown to Introspect (as a tool would).
	wide := map[string]string{
		"wider scopes":     swapPayload(t, mine.token, func(c map[string]any) { c["scopes"] = []string{"tool:*", "s3:*"} }),
		"another holder":   swapPayload(t, mine.token, func(c map[string]any) { c["sub"] = victim.Node.NodeId }),
		"a longer life":    swapPayload(t, mine.token, func(c map[string]any) { c["exp"] = now.AddDate(1, 0, 0).Unix() }),
		"alg none":         forgeJWT(t, map[string]any{"alg": "none", "kid": kid}, map[string]any{"iss": "tether", "sub": rogue.Node.NodeId, "aud": []string{"tether-tools"}, "scopes": []string{"tool:*"}, "chain": []string{}, "jti": mine.grant.GrantId, "exp": now.Add(time.Hour).Unix()}, nil),
		"its own key":      forgeJWT(t, map[string]any{"alg": "EdDSA", "kid": kid}, map[string]any{"iss": "tether", "sub": rogue.Node.NodeId, "aud": []string{"tether-tools"}, "scopes": []string{"tool:*"}, "chain": []string{}, "jti": mine.grant.GrantId, "exp": now.Add(time.Hour).Unix()}, ed),
		"its credential":   rogue.Credential,
		"HS256 public key": forgeJWT(t, map[string]any{"alg": "HS256", "kid": kid}, map[string]any{"iss": "tether", "sub": rogue.Node.NodeId, "aud": []string{"tether-tools"}, "scopes": []string{"tool:*"}, "chain": []string{}, "jti": mine.grant.GrantId, "exp": now.Add(time.Hour).Unix()}, hs256),
	}
	for what, token := range wide {
		in, err := rc.Capability.Introspect(ctx, connect.NewRequest(&tetherv1.IntrospectRequest{Token: token}))
		if err != nil {
			t.Errorf("introspecting %s: %v", what, err)
			continue
		}
		if in.Msg.Active {
			t.Errorf("a capability token forged with %s is active: %v", what, in.Msg)
		}
	}
	if in := introspect(t, admin, mine.token); !in.Active {
		t.Fatalf("the rogue's real token is not active: %s", in.Reason)
	}
}

// reencodeSignature changes the unused low bits of the signature's last
// base64 character: the same signature bytes, another spelling.
func reencodeSignature(token string) string {
	last := token[len(token)-1]
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, last)
	return token[:len(token)-1] + string(alphabet[i^1])
}

// A rogue that names another tree's stop rule in RemoveStopRule learns
// nothing of it: the refusal used to quote the rule's name and who set it
// ("set by agent:n_…", an id of the other tree); then it named only the
// rule id the rogue gave, permission_denied, which still told the id was
// in use; since the forty-second pass it reads as no such rule
// (not_found, rogue42N test). The rule stays.
func TestARogueCannotReadAnotherTreesRuleByRemovingIt(t *testing.T) {
	w := newRogue12World(t)
	ctx := context.Background()
	byVictim, err := w.srv.Clients(w.victimCred).StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: w.running, Name: "secret-budget-guard", Expression: "false", Action: "drain"}))
	if err != nil {
		t.Fatal(err)
	}
	byOperator, err := w.admin.StopRule.AddStopRule(ctx, connect.NewRequest(&tetherv1.AddStopRuleRequest{NodeId: w.victim, Name: "operators-private-rule", Expression: "false", Action: "drain"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*tetherv1.StopRule{byVictim.Msg.Rule, byOperator.Msg.Rule} {
		_, err := w.rogue.StopRule.RemoveStopRule(ctx, connect.NewRequest(&tetherv1.RemoveStopRuleRequest{RuleId: r.RuleId}))
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("removing another tree's rule %s: %v, want not_found", r.RuleId, err)
			continue
		}
		for _, secret := range []string{r.Name, r.SetBy, "operator:", w.victim, w.running} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("the refusal to remove rule %s tells %q: %v", r.RuleId, secret, err)
			}
		}
	}
	rules, err := w.admin.StopRule.ListStopRules(ctx, connect.NewRequest(&tetherv1.ListStopRulesRequest{NodeId: w.running}))
	if err != nil || len(rules.Msg.Rules) != 2 {
		t.Fatalf("the victim's rules after the rogue's attempts: %v %v, want both", rules, err)
	}
}
