package agentsdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherhq/tether/capability"
	"github.com/tetherhq/tether/internal/tokencache"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

// Audience is the aud of capability tokens (the control plane's
// grantstore.Audience): tokens for tools, never accepted as credentials.
const Audience = "tether-tools"

// Verifier defaults.
const (
	DefaultStalenessBudget = 10 * time.Second
	// DefaultCacheSize is the verified tokens a Verifier caches by
	// default: at most MaxCachedClaimBytes of claims each and no token
	// (its digest), some 40 MiB at worst. It was 65,536 entries, each
	// keeping the token and its claims, 640 MiB of a rogue's at worst
	// (rogue40f test).
	DefaultCacheSize       = 1 << 14
	DefaultJWKSMinInterval = 10 * time.Second
	// DefaultJWKSFetchTimeout bounds one fetch of the key set, its body
	// included (the TypeScript verifier's bound): a peer trickling the key
	// set would otherwise hold Run before it follows the revocation feed,
	// and every check of an unknown kid behind it, for as long as it liked.
	DefaultJWKSFetchTimeout = 10 * time.Second
	// jwksRefreshEvery refetches the key set even when no unknown kid was
	// seen, so keys published ahead of use are known before they sign.
	jwksRefreshEvery = 5 * time.Minute
	// maintenanceEvery is how often expired cache entries and droppable
	// tombstones are swept.
	maintenanceEvery = 30 * time.Second
	maxBackoff       = 5 * time.Second
)

// MaxCachedTokensPerHolder bounds the verified tokens a Verifier caches of
// one holder node (a token's sub), its next replacing its oldest: a node
// uses one token per grant it holds, refreshed every few minutes. A rogue
// minting itself a distinct token every second (RefreshToken) and
// presenting each once filled the whole cache (CacheSize) with its own,
// each entry up to a token's 8 KiB and its claims, so that every other
// caller's token paid its signature check again on every call. The
// control plane's cache of credentials holds as many of one principal's.
const MaxCachedTokensPerHolder = 4

// MaxCachedClaimBytes bounds the claims a Verifier caches of one token
// (the bytes of its ids, chain and scopes): a token carrying more is
// verified, signature and all, at each call, and never cached. An agent's
// token of a few scopes carries a few hundred bytes; a rogue's grant of 32
// scopes of 128 bytes, delegated to each of its children, carries 4 KiB,
// and its token 6 KiB more, all of which each cache entry kept.
const MaxCachedClaimBytes = 2 << 10

// ErrScopeNotGranted is returned by Authorize when a valid, unrevoked token
// does not carry the scope the call needs.
var ErrScopeNotGranted = errors.New("agentsdk: scope not granted")

// ErrTreeNotFollowed is returned by Verify and Authorize when the verifier
// follows one tree's revocations only (its Conn holds an agent's
// credential) and the token is another tree's, or names no tree (minted
// before tokens named theirs): the verifier never hears of that tree's
// revocations, so it cannot tell whether the grant still lives. Verify
// such tokens with a verifier that follows the whole feed (a tool
// server's or an operator's token, a viewer's is enough).
var ErrTreeNotFollowed = errors.New("agentsdk: the token's tree is not one this verifier follows")

// VerifierConfig configures a Verifier.
type VerifierConfig struct {
	// Conn reaches the control plane: the key set is fetched from
	// Conn.BaseURL + JWKSPath, and the revocation feed is followed with
	// Conn's bearer token. A tool server verifying tokens from any agent
	// uses an operator token (a viewer's is enough), which sees the whole
	// feed; an agent credential sees only its own tree's revocations, so
	// it suits only a verifier of tokens from that tree: the feed names
	// the tree it follows, and a token of another tree (its root claim),
	// or of none, is refused with ErrTreeNotFollowed, since its revocation
	// would never be heard.
	Conn *Conn
	// Issuer is the expected iss; default "tether".
	Issuer string
	// Leeway is the clock skew allowed on exp, nbf and iat; default
	// capability.DefaultLeeway, at most capability.MaxLeeway.
	Leeway time.Duration
	// StalenessBudget is how old the revocation feed may be before every
	// verification fails closed (capability.ErrFeedStale); default
	// DefaultStalenessBudget. Keep it several times the control plane's
	// heartbeat (two seconds by default). The feed's age is measured on
	// Go's monotonic clock by default; on an injected Clock, a step back
	// does not make it younger (feedClock).
	StalenessBudget time.Duration
	// CacheSize bounds the verified tokens kept (until they expire) so that
	// their signatures are not checked again; default DefaultCacheSize,
	// negative to disable the cache. An entry keeps the token's digest and
	// its claims (at most MaxCachedClaimBytes), at most
	// MaxCachedTokensPerHolder of one holder's; once the cache is full, a
	// token of a lineage (its root grant and all delegated under it)
	// holding an eighth of it or more replaces its lineage's oldest, and
	// any other's makes room, expired entries and the largest lineages'
	// oldest first (the control plane's own caches' rule): a rogue whose
	// children each present their tokens keeps at most its share.
	CacheSize int
	// JWKSMinInterval is the least time between two key-set fetches caused
	// by unknown kids; default DefaultJWKSMinInterval.
	JWKSMinInterval time.Duration
	// JWKSFetchTimeout bounds one fetch of the key set, its body included
	// (a network deadline, on the real clock); default
	// DefaultJWKSFetchTimeout.
	JWKSFetchTimeout time.Duration
	Clock            Clock
	Logger           *slog.Logger
}

// Verifier checks capability tokens for a resource server or tool gate
// offline: the signature against the control plane's JWKS, the claims with
// pinned options (capability.Verifier), and revocation against an
// in-memory tombstone set that follows the control plane's revocation feed.
//
// Every call:
//
//  1. fails closed (capability.ErrFeedStale) when the feed was last heard
//     from longer than the staleness budget ago, or never, before the
//     token is looked at and again after (a key-set fetch may have taken
//     its time);
//  2. verifies the token, or finds it in the cache of tokens already
//     verified (the cache skips only the signature and claim parsing; it
//     keeps the token's digest, not the token, and is bounded per holder,
//     per lineage and by the claims of an entry: VerifierConfig.CacheSize);
//  3. rejects a token past its exp, and one whose jti or any chain entry is
//     tombstoned (capability.ErrGrantRevoked);
//  4. when the feed follows one tree only (an agent's credential), rejects
//     a token whose root claim names another tree, or none
//     (ErrTreeNotFollowed).
//
// Run must be running for the feed to be followed; until its first
// message arrives every call fails closed. A Verifier is safe for
// concurrent use.
type Verifier struct {
	cfg        VerifierConfig
	verifier   capability.Verifier
	jwks       *jwksCache
	tombstones *capability.TombstoneSet
	// feed is the clock the feed's age is measured on (feedClock).
	feed *feedClock

	// cache maps a token's digest to its verified claims (nil: no
	// cache); cacheMu guards it, read-locked for a lookup.
	cacheMu sync.RWMutex
	cache   *tokencache.Cache[*capability.Claims]

	ready     chan struct{}
	readyOnce sync.Once
	messages  atomic.Uint64
	// revised is closed, and replaced, each time the tombstone set gains
	// a tombstone or is replaced by a snapshot (Revised).
	revised atomic.Pointer[chan struct{}]
	// snapshot gathers a snapshot that spans several feed messages (each
	// but its last continues): the set is replaced only with the last, so
	// that no revocation of the old set is forgotten before the copy is
	// whole. nil when no snapshot is under way. Only Run's goroutine
	// touches it.
	snapshot []capability.Tombstone
	// tree is the root node id of the one tree the feed follows (the
	// feed's tree_root), "" while it follows the whole feed. Set before
	// the message that names it marks the feed fresh.
	tree atomic.Pointer[string]
	// applied, when set (tests), runs after each feed message is applied.
	applied func(*tetherv1.WatchRevocationsResponse)
}

// NewVerifier returns a Verifier; start its Run.
func NewVerifier(cfg VerifierConfig) (*Verifier, error) {
	if cfg.Conn == nil {
		return nil, errors.New("agentsdk: verifier needs a Conn to the control plane")
	}
	if cfg.Issuer == "" {
		cfg.Issuer = "tether"
	}
	if cfg.Leeway == 0 {
		cfg.Leeway = capability.DefaultLeeway
	}
	if cfg.StalenessBudget <= 0 {
		cfg.StalenessBudget = DefaultStalenessBudget
	}
	if cfg.CacheSize == 0 {
		cfg.CacheSize = DefaultCacheSize
	}
	if cfg.JWKSMinInterval <= 0 {
		cfg.JWKSMinInterval = DefaultJWKSMinInterval
	}
	if cfg.JWKSFetchTimeout <= 0 {
		cfg.JWKSFetchTimeout = DefaultJWKSFetchTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = WallClock
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	v, err := capability.NewVerifier(cfg.Issuer, Audience, cfg.Leeway)
	if err != nil {
		return nil, err
	}
	ver := &Verifier{
		cfg:        cfg,
		feed:       newFeedClock(cfg.Clock),
		verifier:   v,
		jwks:       newJWKSCache(cfg.Conn.BaseURL, cfg.Conn.HTTP, cfg.Clock.Now, cfg.JWKSMinInterval, cfg.JWKSFetchTimeout),
		tombstones: &capability.TombstoneSet{},
		ready:      make(chan struct{}),
	}
	if cfg.CacheSize > 0 {
		ver.cache = tokencache.New[*capability.Claims](cfg.CacheSize, MaxCachedTokensPerHolder, max(1, cfg.CacheSize/8))
	}
	revised := make(chan struct{})
	ver.revised.Store(&revised)
	return ver, nil
}

// Revised returns a channel that is closed once the verifier has applied
// a revocation after this call (a tombstone from the feed, or a snapshot
// that replaced its set): what holds on to something a token admitted (a
// session, a stream) takes the channel, checks what it holds with
// Revoked, and checks again when the channel closes, so that it misses no
// revocation in between.
func (v *Verifier) Revised() <-chan struct{} { return *v.revised.Load() }

// Revoked reports, as Verify would, whether the grant of claims (or one of
// its chain) is known revoked: an error wrapping capability.ErrGrantRevoked,
// or nil. It checks neither the signature nor the expiry nor the feed's
// freshness: claims are those of a token verified before, and the question
// is only whether its grant has died since. (A token past its expiry is
// still found revoked.)
func (v *Verifier) Revoked(claims capability.Claims) error {
	via, revoked := v.tombstones.Revoked(claims.GrantID, claims.Chain)
	switch {
	case !revoked:
		return nil
	case via == claims.GrantID:
		return fmt.Errorf("%w: grant %s is revoked", capability.ErrGrantRevoked, claims.GrantID)
	}
	return fmt.Errorf("%w: grant %s is revoked via ancestor grant %s", capability.ErrGrantRevoked, claims.GrantID, via)
}

// Verify checks a token for use now and returns its claims. Errors wrap
// capability.ErrFeedStale, capability.ErrGrantRevoked,
// capability.ErrTokenExpired, or one of capability.Verifier.Verify's
// sentinels, and never contain the token. The returned claims share their
// slices with the cache: do not modify them.
func (v *Verifier) Verify(ctx context.Context, token string) (capability.Claims, error) {
	if err := v.Fresh(); err != nil {
		return capability.Claims{}, err
	}
	claims, err := v.claims(ctx, token, v.cfg.Clock.Now())
	if err != nil {
		return capability.Claims{}, err
	}
	// Again where the tombstones are read: a check of an unknown kid
	// waits for the key set (up to JWKSFetchTimeout, behind another
	// fetch), and a feed that died meanwhile, the budget passing, left a
	// revocation unheard that the check did not look for.
	if err := v.Fresh(); err != nil {
		return capability.Claims{}, err
	}
	if err := v.Revoked(*claims); err != nil {
		return capability.Claims{}, err
	}
	if err := v.follows(*claims); err != nil {
		return capability.Claims{}, err
	}
	return *claims, nil
}

// Tree is the root node id of the one tree whose revocations the verifier
// follows (its Conn holds an agent's credential), or "" when it follows the
// whole feed or has heard nothing yet.
func (v *Verifier) Tree() string {
	if t := v.tree.Load(); t != nil {
		return *t
	}
	return ""
}

// follows refuses a token of a tree the verifier does not follow
// (ErrTreeNotFollowed): the feed it follows is one tree's, and the token's
// root claim names another, or none.
func (v *Verifier) follows(claims capability.Claims) error {
	tree := v.Tree()
	switch {
	case tree == "" || claims.Root == tree:
		return nil
	case claims.Root == "":
		return fmt.Errorf("%w: this verifier follows only tree %s's revocations (its connection holds an agent's credential), and the token for grant %s names no tree (minted before tokens named theirs; refresh it); verify it with a verifier that follows every tree (a tool server's or a viewer's token)", ErrTreeNotFollowed, tree, claims.GrantID)
	}
	return fmt.Errorf("%w: this verifier follows only tree %s's revocations (its connection holds an agent's credential), and grant %s is held in another tree, whose revocations it never hears of; verify it with a verifier that follows every tree (a tool server's or a viewer's token)", ErrTreeNotFollowed, tree, claims.GrantID)
}

// Identify checks a token's signature and expiry, but neither the
// revocation feed nor its freshness: it tells a transport who is calling
// (the holder node, for binding a session) so that the per-call Verify or
// Authorize can refuse a revoked token in the caller's own protocol, with
// the reason, rather than as an anonymous authentication failure. Never
// authorize anything on Identify alone.
func (v *Verifier) Identify(ctx context.Context, token string) (capability.Claims, error) {
	claims, err := v.claims(ctx, token, v.cfg.Clock.Now())
	if err != nil {
		return capability.Claims{}, err
	}
	return *claims, nil
}

// Holder is Identify for a token that may be past its expiry: one whose
// only fault is its expiry returns its claims with the error (wrapping
// capability.ErrTokenExpired; capability.Verifier.VerifyHolder), so that
// a tool layer can report the holder of a dead credential it served (the
// control plane weighs it as that node at work). Never authorize anything
// on its claims.
func (v *Verifier) Holder(ctx context.Context, token string) (capability.Claims, error) {
	claims, err := v.Identify(ctx, token)
	if !errors.Is(err, capability.ErrTokenExpired) {
		return claims, err
	}
	dead, derr := v.verifier.VerifyHolder(token, *v.jwks.keys(), v.cfg.Clock.Now())
	if dead.HolderNodeID == "" {
		return capability.Claims{}, err
	}
	return dead, derr
}

// Authorize is Verify plus the scope check a tool call needs: the token's
// scopes must allow requiredScope (capability.Allows), else the error
// wraps ErrScopeNotGranted.
func (v *Verifier) Authorize(ctx context.Context, token, requiredScope string) (capability.Claims, error) {
	claims, err := v.Verify(ctx, token)
	if err != nil {
		return capability.Claims{}, err
	}
	if !capability.Allows(claims.Scopes, requiredScope) {
		return capability.Claims{}, fmt.Errorf("%w: grant %s does not allow scope %q", ErrScopeNotGranted, claims.GrantID, describeScope(requiredScope))
	}
	return claims, nil
}

// claims returns the verified claims of token, from the cache when it was
// verified before and has not expired.
func (v *Verifier) claims(ctx context.Context, token string, now time.Time) (*capability.Claims, error) {
	var sum tokencache.Sum
	if v.cache != nil {
		sum = tokencache.Digest(token)
		v.cacheMu.RLock()
		c, ok := v.cache.Get(sum)
		v.cacheMu.RUnlock()
		if ok {
			if now.Before(c.ExpiresAt) {
				return c, nil
			}
			v.forget(sum)
			return nil, fmt.Errorf("%w: token for grant %s expired at %s", capability.ErrTokenExpired, c.GrantID, c.ExpiresAt.UTC().Format(time.RFC3339))
		}
	}
	ring := v.jwks.keys()
	claims, err := v.verifier.Verify(token, *ring, now)
	if errors.Is(err, capability.ErrUnknownKey) {
		// A key rotated in since the last fetch, or a forged kid: refetch,
		// rate-limited, and try once more with whatever ring is newer.
		if newer, ferr := v.jwks.refreshAfterMiss(ctx, ring); ferr != nil {
			v.warn("agentsdk: refreshing the key set failed", ferr)
		} else if newer != nil {
			claims, err = v.verifier.Verify(token, *newer, now)
		}
	}
	if err != nil {
		return nil, err
	}
	c := &claims
	if v.cache != nil {
		v.remember(sum, c, now)
	}
	return c, nil
}

// remember caches a verified token's claims under its digest, unless they
// pass MaxCachedClaimBytes: at most MaxCachedTokensPerHolder of one
// holder's (its next replaces its oldest), and, once the cache is full, a
// lineage's share (tokencache).
func (v *Verifier) remember(sum tokencache.Sum, c *capability.Claims, now time.Time) {
	if claimBytes(*c) > MaxCachedClaimBytes {
		return
	}
	v.cacheMu.Lock()
	defer v.cacheMu.Unlock()
	if _, ok := v.cache.Get(sum); ok {
		return
	}
	v.cache.Put(sum, c.HolderNodeID, lineageOf(*c), c.ExpiresAt, now, c)
}

// forget drops a token's entry from the cache.
func (v *Verifier) forget(sum tokencache.Sum) {
	v.cacheMu.Lock()
	defer v.cacheMu.Unlock()
	v.cache.Remove(sum)
}

// claimBytes is what the strings of c hold, in bytes: what a cache entry
// keeps of the token.
func claimBytes(c capability.Claims) int {
	n := len(c.GrantID) + len(c.HolderNodeID) + len(c.Root) + len(c.KeyID)
	for _, s := range c.Chain {
		n += len(s)
	}
	for _, s := range c.Scopes {
		n += len(s)
	}
	return n
}

// lineageOf is the lineage of a token's grant: the root grant of its
// chain, or the grant itself for a root grant (the control plane's
// caches group tokens so too).
func lineageOf(c capability.Claims) string {
	if len(c.Chain) > 0 {
		return c.Chain[0]
	}
	return c.GrantID
}

// Ready is closed once the first feed message has been applied: from then
// on Verify can succeed (as long as the feed keeps arriving).
func (v *Verifier) Ready() <-chan struct{} { return v.ready }

// Head is the last feed sequence the verifier has applied.
func (v *Verifier) Head() uint64 { return v.tombstones.Head() }

// Fresh returns nil while the feed is within the staleness budget, and the
// error every Verify would fail with otherwise.
func (v *Verifier) Fresh() error {
	now, behind := v.feed.read()
	if err := v.tombstones.CheckFresh(now, v.cfg.StalenessBudget); err != nil {
		return err
	}
	if behind {
		return fmt.Errorf("%w: the clock went back past the feed's last message", capability.ErrFeedStale)
	}
	return nil
}

// feedClock is what the revocation feed's age is measured on, so that a
// clock set back (an NTP step, a VM resumed) cannot make a feed that died
// read fresh. On the default clock it is Go's monotonic reading: WallClock
// reads UTC, which has none, and a feed measured on it was younger by
// every step back of the host's clock. On an injected Clock, a reading
// that never goes back: the clock's forward steps between two readings
// added up, a step back counted as no time; and a clock that reads
// earlier than it did at the feed's last message fails closed (behind)
// until it passes that reading again or the feed speaks, as it cannot say
// how long ago the message came. Time that passed before a step back
// with no reading in between is not counted: only readings tell it.
type feedClock struct {
	clock Clock // nil: Go's monotonic clock

	mu      sync.Mutex
	origin  time.Time     // the injected clock's first reading
	last    time.Time     // its last reading
	elapsed time.Duration // its forward steps since origin
	synced  time.Time     // its reading at the feed's last message
}

func newFeedClock(c Clock) *feedClock {
	if c == WallClock {
		return &feedClock{}
	}
	return &feedClock{clock: c}
}

// read returns the time to measure the feed's age with and whether the
// injected clock reads earlier than at the feed's last message.
func (f *feedClock) read() (now time.Time, behind bool) {
	if f.clock == nil {
		return time.Now(), false
	}
	f.mu.Lock() // around the reading too: readings are taken in order
	defer f.mu.Unlock()
	raw := f.clock.Now()
	return f.advanceLocked(raw), !f.synced.IsZero() && raw.Before(f.synced)
}

// sync returns the time the feed's message arrived at, and notes it as
// the feed's last.
func (f *feedClock) sync() time.Time {
	if f.clock == nil {
		return time.Now()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	raw := f.clock.Now()
	f.synced = raw
	return f.advanceLocked(raw)
}

func (f *feedClock) advanceLocked(raw time.Time) time.Time {
	if f.origin.IsZero() {
		f.origin, f.last = raw, raw
	}
	if step := raw.Sub(f.last); step > 0 {
		f.elapsed += step
	}
	f.last = raw
	return f.origin.Add(f.elapsed)
}

// Run follows the revocation feed and keeps the key set, until ctx ends.
// It reconnects after a failure, with backoff, resuming after the last
// sequence applied; when the control plane answers with a snapshot (the
// verifier's position was compacted away) the tombstone set is replaced
// once the snapshot's last message (one that does not continue) has
// arrived, the old set kept, with the copy's tombstones added, until then.
// The verifier is not ready, nor fresh again, on a message that continues.
// A stream that goes silent for the staleness budget is dropped and
// reopened. Run returns nil when ctx ends.
func (v *Verifier) Run(ctx context.Context) error {
	if err := v.jwks.refresh(ctx); err != nil && ctx.Err() == nil {
		v.warn("agentsdk: fetching the key set failed; will retry", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { v.maintain(ctx) })
	defer wg.Wait()
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		applied, err := v.follow(ctx)
		if ctx.Err() != nil {
			break
		}
		v.warn("agentsdk: revocation feed interrupted; reconnecting", err)
		if applied > 0 {
			backoff = 50 * time.Millisecond
		}
		timer := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
		timer.Stop()
		backoff = min(2*backoff, maxBackoff)
	}
	return nil
}

// follow reads one feed stream until it fails and returns how many
// messages it applied.
func (v *Verifier) follow(ctx context.Context) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A stream that stays silent past the budget is dead or stalled; the
	// verifier is failing closed by then, and a new stream may do better.
	watchdog := time.AfterFunc(v.cfg.StalenessBudget, cancel)
	defer watchdog.Stop()
	stream, err := v.cfg.Conn.Capability.WatchRevocations(ctx, connect.NewRequest(&tetherv1.WatchRevocationsRequest{AfterSequence: v.tombstones.Head()}))
	if err != nil {
		return 0, err
	}
	defer stream.Close()
	// A snapshot cut off by the last stream's end is not finished by this
	// one: it resumes from the old position and starts its own.
	v.snapshot = nil
	applied := 0
	for stream.Receive() {
		watchdog.Reset(v.cfg.StalenessBudget)
		if err := v.apply(stream.Msg()); err != nil {
			return applied, err
		}
		applied++
	}
	if err := stream.Err(); err != nil {
		return applied, err
	}
	return applied, errors.New("agentsdk: the control plane closed the revocation feed")
}

func (v *Verifier) apply(msg *tetherv1.WatchRevocationsResponse) error {
	// A tombstone is kept by its grant id and times, not its reason: a
	// revoked token is refused by the id alone, and the set holds every
	// live tombstone for a quarter of an hour and more. A rogue agent
	// revoking the grants it delegates with a reason of
	// capability.MaxReasonBytes each had every tool server's verifier
	// keep a KiB of its text per tombstone, five times the rest of it
	// (rogue42h test); the TypeScript and Python verifiers keep none.
	tombstones := make([]capability.Tombstone, len(msg.Tombstones))
	for i, t := range msg.Tombstones {
		tombstones[i] = capability.Tombstone{
			Sequence:  t.Sequence,
			GrantID:   t.GrantId,
			RevokedAt: asTime(t.RevokedAt),
			DropAfter: asTime(t.DropAfter),
		}
	}
	if msg.Snapshot {
		// A new copy starts (one cut off by a broken stream is dropped:
		// the next stream resumes from the old position, and answers
		// with a snapshot again).
		v.snapshot = []capability.Tombstone{}
	}
	// The tree the feed follows, before the message marks it fresh: a
	// verification that finds the feed fresh finds its tree too.
	if tree := msg.TreeRoot; v.Tree() != tree {
		v.tree.Store(&tree)
	}
	replaced := false
	switch {
	case v.snapshot != nil && !msg.Continues:
		// The snapshot's last message: the set becomes the copy, whole.
		whole := append(v.snapshot, tombstones...)
		v.snapshot = nil
		if err := v.tombstones.Replace(whole, msg.HeadSequence); err != nil {
			return err
		}
		replaced = true
	case v.snapshot != nil:
		// The copy continues in the next message. The old set stays
		// whole until then (a snapshot that replaced it with its first
		// message forgot, until its last, every revocation the copy sent
		// later), and gains the copy's tombstones so far: revocation only
		// narrows.
		if err := v.tombstones.Add(tombstones...); err != nil {
			return err
		}
		v.snapshot = append(v.snapshot, tombstones...)
	default:
		if err := v.tombstones.Add(tombstones...); err != nil {
			return err
		}
	}
	if !msg.Continues {
		// Freshness is measured on this verifier's clock, when the message
		// arrived, not by the server's time in it. A message cut short is
		// not the feed's head: the verifier is not ready, nor fresh again,
		// until the message that reaches it. A clock set back does not
		// make it younger (feedClock).
		v.tombstones.MarkSynced(msg.HeadSequence, v.feed.sync())
	}
	if len(tombstones) > 0 || replaced {
		next := make(chan struct{})
		close(*v.revised.Swap(&next))
	}
	v.messages.Add(1)
	if !msg.Continues {
		v.readyOnce.Do(func() { close(v.ready) })
	}
	if v.applied != nil {
		v.applied(msg)
	}
	return nil
}

// maintain sweeps expired cache entries and droppable tombstones and
// refetches the key set now and then.
func (v *Verifier) maintain(ctx context.Context) {
	ticker := time.NewTicker(maintenanceEvery)
	defer ticker.Stop()
	lastJWKS := v.cfg.Clock.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		now := v.cfg.Clock.Now()
		v.tombstones.Prune(now)
		if v.cache != nil {
			v.cacheMu.Lock()
			v.cache.Expire(now)
			v.cacheMu.Unlock()
		}
		if now.Sub(lastJWKS) >= jwksRefreshEvery {
			lastJWKS = now
			if err := v.jwks.refresh(ctx); err != nil && ctx.Err() == nil {
				v.warn("agentsdk: refreshing the key set failed", err)
			}
		}
	}
}

func asTime(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

// describeScope quotes a scope for an error when it is well-formed.
func describeScope(s string) string {
	if capability.ValidateScope(s) != nil {
		return "(malformed scope)"
	}
	return s
}

// warn logs why the key set or the feed failed, without the Conn's token
// or its signature: the peer writes the error (a key set's kid, a feed's
// refusal), and could quote the token the feed was opened with.
func (v *Verifier) warn(msg string, err error) {
	v.cfg.Logger.Warn(msg, "error", withoutSecret(err.Error(), v.cfg.Conn.Token(), "bearer token"))
}
