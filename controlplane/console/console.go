package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/tetherhq/tether/agentsdk"
	tetherv1 "github.com/tetherhq/tether/proto/tether/v1"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Config configures the console.
type Config struct {
	// API serves the public Connect API; the console's clients send every
	// request to it in process (the control plane passes its own handler).
	API http.Handler
	// Now is the clock sessions expire by.
	Now func() time.Time
	// Log receives the console's own errors (never a token).
	Log *slog.Logger
	// SessionTTL bounds a session; it never outlives its token. Default 8h.
	SessionTTL time.Duration
	// MaxSessions bounds the sessions held in memory; default 10000.
	MaxSessions int
}

// Console is the http.Handler serving /ui/.
type Console struct {
	cfg      Config
	mux      *http.ServeMux
	pages    map[string]*template.Template
	cop      *http.CrossOriginProtection
	hc       *http.Client
	mu       sync.Mutex
	seq      uint64
	sessions map[string]*session
}

// session is one signed-in operator. The token stays here, in memory.
type session struct {
	id   string
	csrf string
	// bind is the secret the first page the sign-in led to gave this
	// browser (bindShown; see action): in no other page, no cookie and
	// no URL.
	bind      string
	bindShown atomic.Bool
	principal string
	role      tetherv1.Role
	seq       uint64 // sign-in order
	expires   time.Time
	clients   *clients
	// ended is done once the session has ended (signed out, evicted or
	// expired): the live pages' streams end with it.
	ended context.Context
	end   context.CancelFunc
}

// clients are the API's services, presenting the session's token: the
// SDK's client, over the in-process transport.
type clients = agentsdk.Conn

// apiBase is the base URL of the in-process clients; the host is never
// dialled (handlerTransport serves every request).
const apiBase = "http://console.invalid"

func (c *Console) newClients(token string) *clients {
	return agentsdk.Dial(apiBase, token, agentsdk.WithHTTPClient(c.hc))
}

// New builds the console.
func New(cfg Config) (*Console, error) {
	if cfg.API == nil {
		return nil, errors.New("console: Config.API is required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = 8 * time.Hour
	}
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = 10000
	}
	c := &Console{
		cfg:      cfg,
		mux:      http.NewServeMux(),
		cop:      http.NewCrossOriginProtection(),
		hc:       &http.Client{Transport: handlerTransport{handler: cfg.API}},
		sessions: map[string]*session{},
	}
	c.cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, nil, http.StatusForbidden, "refused: cross-origin request", "The form was posted from another site (Origin or Sec-Fetch-Site says so). Nothing was changed.")
	}))
	if err := c.parseTemplates(); err != nil {
		return nil, err
	}
	c.routes()
	return c, nil
}

func (c *Console) parseTemplates() error {
	funcs := templateFuncs()
	layout, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html")
	if err != nil {
		return fmt.Errorf("console: templates: %w", err)
	}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return err
	}
	c.pages = map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if base == "layout" {
			continue
		}
		t, err := template.Must(layout.Clone()).ParseFS(templateFS, n)
		if err != nil {
			return fmt.Errorf("console: template %s: %w", n, err)
		}
		c.pages[base] = t
	}
	return nil
}

// ServeHTTP sets the security headers of every response and routes.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	if r.TLS != nil {
		h.Set("Strict-Transport-Security", "max-age=31536000")
	}
	if !strings.HasPrefix(r.URL.Path, "/ui/static/") {
		h.Set("Cache-Control", "no-store")
	}
	c.mux.ServeHTTP(w, withPeer(r))
}

func (c *Console) routes() {
	static, _ := fs.Sub(staticFS, "static")
	c.mux.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", http.FileServerFS(static)))
	c.mux.HandleFunc("GET /ui/signin", c.signinPage)
	c.mux.Handle("POST /ui/signin", c.cop.Handler(http.HandlerFunc(c.signin)))
	c.mux.Handle("POST /ui/signout", c.action(c.signout, false))
	c.mux.Handle("GET /ui/{$}", c.page(func(w http.ResponseWriter, r *http.Request, _ *session) {
		http.Redirect(w, r, "/ui/tree", http.StatusSeeOther)
	}))
	c.mux.Handle("GET /ui/tree", c.page(c.tree))
	c.mux.Handle("GET /ui/nodes/{id}", c.page(c.node))
	c.mux.Handle("POST /ui/nodes/{id}/terminate", c.action(c.terminate, true))
	c.mux.Handle("GET /ui/terminations/{id}", c.page(c.termination))
	c.mux.Handle("GET /ui/terminations/{id}/events", c.page(c.terminationEvents))
	c.mux.Handle("GET /ui/records", c.page(c.records))
	c.mux.Handle("GET /ui/records/{id}", c.page(c.record))
	c.mux.Handle("GET /ui/records/{id}/json", c.page(c.recordJSON))
	c.mux.Handle("GET /ui/leases", c.page(c.leases))
	c.mux.Handle("GET /ui/jobs/{job}/evidence", c.page(c.evidence))
	c.mux.Handle("GET /ui/jobs/{job}/evidence/csv", c.page(c.evidenceCSV))
	c.mux.Handle("GET /ui/grants/{id}", c.page(c.grant))
	c.mux.Handle("GET /ui/grants/{id}/revoke", c.page(c.revokeConfirm))
	c.mux.Handle("POST /ui/grants/{id}/revoke", c.action(c.revoke, true))
	c.mux.Handle("POST /ui/proposals/{id}/decide", c.action(c.decide, true))
	c.mux.Handle("GET /ui/rollouts", c.page(c.rollouts))
	c.mux.Handle("GET /ui/rollouts/{id}", c.page(c.rollout))
	c.mux.Handle("GET /ui/rollouts/{id}/events", c.page(c.rolloutEvents))
	c.mux.Handle("POST /ui/rollouts/{id}/{op}", c.action(c.rolloutAction, true))
	c.mux.Handle("GET /ui/revocations", c.page(c.revocations))
	c.mux.Handle("GET /ui/revocations/events", c.page(c.revocationEvents))
	c.mux.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		// Quoted: the path is whoever made the link's text, not the console's.
		c.fail(w, r, c.current(r), http.StatusNotFound, "not found", "The console has no page at "+strconv.Quote(r.URL.Path)+".")
	})
}

// cookieName is the session cookie's name; over TLS the __Host- prefix
// makes the browser insist on Secure, Path=/ and no Domain.
func cookieName(r *http.Request) string {
	if r.TLS != nil {
		return "__Host-tether_console"
	}
	return "tether_console"
}

// current returns the request's live session, or nil.
func (c *Console) current(r *http.Request) *session {
	cookies := r.CookiesNamed(cookieName(r))
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.presentedLocked(cookies)
}

// presentedLocked is the live session among the cookies of the console's
// name a request carries (c.mu held): the last of them that names one.
// Over plain HTTP the console's cookie is not the console's alone: a
// server of another port of its host (where an agent may serve a page),
// or another host of its domain, may set one of the same name for a path
// of the console, and the browser sends it beside the console's, first
// (RFC 6265 §5.4: a longer path first; the console's is at "/"). The
// console read the first alone: a rogue's "tether_console=x" for the
// path of its own node page sent the operator who opened that page, or
// posted its stop, to sign in, however often the operator signed in
// again (rogue48i test). A name that is no live session is passed over;
// an expired one is ended.
func (c *Console) presentedLocked(cookies []*http.Cookie) *session {
	var s *session
	now := c.cfg.Now()
	for _, ck := range cookies {
		o := c.sessions[ck.Value]
		if ck.Value == "" || o == nil {
			continue
		}
		if !now.Before(o.expires) {
			c.endLocked(o)
			continue
		}
		s = o
	}
	return s
}

// endLocked ends a session (c.mu held): it leaves the table, and its live
// streams end.
func (c *Console) endLocked(s *session) {
	delete(c.sessions, s.id)
	s.end()
}

// live reports whether s is still a session of the table, unexpired on
// the console's clock; one found expired is ended.
func (c *Console) live(s *session) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sessions[s.id] != s {
		return false
	}
	if !c.cfg.Now().Before(s.expires) {
		c.endLocked(s)
		return false
	}
	return true
}

// page wraps a GET handler: no session, no page (back to sign-in); and
// none for another site's page (fromAnotherSite), before anything is read.
func (c *Console) page(h func(http.ResponseWriter, *http.Request, *session)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw := strings.HasSuffix(r.URL.Path, "/events") || strings.HasSuffix(r.URL.Path, "/csv") || strings.HasSuffix(r.URL.Path, "/json")
		if fromAnotherSite(r) {
			if raw {
				http.Error(w, "refused: requested by another site's page", http.StatusForbidden)
				return
			}
			c.fail(w, r, nil, http.StatusForbidden, "refused: requested by another site's page", "Another site's page had your browser ask for this console page (an image, a frame, a script or a fetch: Sec-Fetch-Site and Sec-Fetch-Dest say so). The console serves its pages to its own pages and to links you follow; nothing was read. Open the console from its address or a link.")
			return
		}
		s := c.current(r)
		if s == nil {
			if raw {
				http.Error(w, "not signed in", http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, "/ui/signin", http.StatusSeeOther)
			return
		}
		h(w, r, s)
	})
}

// fromAnotherSite reports whether a browser sent r for a page of another
// origin other than as a top-level navigation (Fetch Metadata: the
// request's Sec-Fetch-Site is same-site or cross-site, and its
// Sec-Fetch-Dest is not a document navigated to): an image, a frame, a
// script, a style sheet, a fetch or an event stream of another site's
// page. The session cookie is SameSite=Strict, which keeps it from
// another site's requests but not from a same-site one's (another port
// of the console's host, another host of its registrable domain: where
// an agent may serve a page), and CrossOriginProtection guards the
// console's POSTs only, so such a page had the operator's browser load
// console pages in the operator's session as fast as it liked, each of
// their API calls charged to the operator's rate budget (a tree page
// makes up to forty), until the operator's own stop was refused. A link
// followed from another site (a navigation: one page, in the operator's
// sight) is served; a browser that sends no Fetch Metadata is not told
// apart.
func fromAnotherSite(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
		return false
	}
	return r.Header.Get("Sec-Fetch-Mode") != "navigate" || r.Header.Get("Sec-Fetch-Dest") != "document"
}

// maxSessionsPerPrincipal bounds the sessions one operator identity holds
// at once; signing in again beyond it ends the oldest.
const maxSessionsPerPrincipal = 32

// maxFormBytes bounds a posted form.
const maxFormBytes = 64 << 10

// action wraps a state-changing POST: same-origin (CrossOriginProtection),
// a live session, and the session's CSRF token, or nothing happens; a
// bound action (all but sign-out) also the session's bind secret.
//
// A session's cookie is not the operator's alone. Cookies are not
// isolated by port (RFC 6265 §8.5): the browser sends the console's
// session cookie, HttpOnly and SameSite=Strict as it is, with every
// request of a page of any port of the console's host, to that port, so
// an agent serving a page there ("my report: http://127.0.0.1:8800/")
// read the session id from the operator's visit, and its own client,
// which sends no Fetch Metadata, read a console page in the session for
// its CSRF token and acted as the operator (rogue47d test). The bind
// secret is in the first page the sign-in's redirect leads to and in no
// later one (render): the browser that signed in follows that redirect at
// once, before it can visit another page. The console's script keeps it
// in the console origin's localStorage, which no other port's page reads,
// and adds it to every form it posts.
func (c *Console) action(h func(http.ResponseWriter, *http.Request, *session), bound bool) http.Handler {
	return c.cop.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, nil, http.StatusBadRequest, "refused: unreadable form", "The form could not be read. Nothing was changed.")
			return
		}
		s := c.current(r)
		if s == nil {
			c.fail(w, r, nil, http.StatusUnauthorized, "refused: not signed in", "Your session has ended or never began. Sign in and try again; nothing was changed.")
			return
		}
		got := r.PostForm.Get("csrf")
		if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) != 1 {
			c.fail(w, r, s, http.StatusForbidden, "refused: missing or wrong CSRF token", "The form did not carry this session's CSRF token, so it did not come from a console page you opened. Nothing was changed.")
			return
		}
		if got := r.PostForm.Get("bind"); bound && (got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(s.bind)) != 1) {
			c.fail(w, r, s, http.StatusForbidden, "refused: not the browser that signed in", "The form did not carry the secret the console gave the browser that signed in to this session (its script adds it to every form). Nothing was changed. Sign out and sign in again in this browser.")
			return
		}
		h(w, r, s)
	}))
}

func randomID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (c *Console) signinPage(w http.ResponseWriter, r *http.Request) {
	if c.current(r) != nil {
		http.Redirect(w, r, "/ui/tree", http.StatusSeeOther)
		return
	}
	c.render(w, r, nil, http.StatusOK, "signin", "Sign in", map[string]any{})
}

// signin checks the pasted token with WhoAmI (through the API, like every
// other call) and opens a session for an operator. Agent credentials are
// refused.
func (c *Console) signin(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, nil, http.StatusBadRequest, "refused: unreadable form", "The form could not be read.")
		return
	}
	token := strings.TrimSpace(r.PostForm.Get("token"))
	again := func(status int, msg string) {
		c.render(w, r, nil, status, "signin", "Sign in", map[string]any{"Error": msg})
	}
	if token == "" {
		again(http.StatusBadRequest, "Paste an operator token (tether token create --role viewer|operator|security|admin, or the admin token in the data directory).")
		return
	}
	cl := c.newClients(token)
	who, err := cl.Auth.WhoAmI(r.Context(), connect.NewRequest(&tetherv1.WhoAmIRequest{}))
	if err != nil {
		again(http.StatusUnauthorized, errorText(err))
		return
	}
	if who.Msg.NodeId != "" || !strings.HasPrefix(who.Msg.Principal, "operator:") {
		again(http.StatusForbidden, "This is an agent credential. The console is for operators: sign in with an operator token.")
		return
	}
	now := c.cfg.Now()
	expires := now.Add(c.cfg.SessionTTL)
	if e := who.Msg.ExpiresAt; e != nil && e.AsTime().Before(expires) {
		expires = e.AsTime()
	}
	s := &session{id: randomID(), csrf: randomID(), bind: randomID(), principal: who.Msg.Principal, role: who.Msg.Role, expires: expires, clients: cl}
	s.ended, s.end = context.WithCancel(context.Background())
	presented := r.CookiesNamed(cookieName(r))
	c.mu.Lock()
	// Drop expired sessions, the one this browser had, and the oldest of
	// this principal's beyond maxSessionsPerPrincipal (one token cannot
	// fill the table and lock everybody else out).
	if o := c.presentedLocked(presented); o != nil {
		c.endLocked(o)
	}
	var mine []*session
	for _, old := range c.sessions {
		switch {
		case !now.Before(old.expires):
			c.endLocked(old)
		case old.principal == s.principal:
			mine = append(mine, old)
		}
	}
	if len(mine) >= maxSessionsPerPrincipal {
		sort.Slice(mine, func(i, j int) bool { return mine[i].seq < mine[j].seq })
		for _, old := range mine[:len(mine)-maxSessionsPerPrincipal+1] {
			c.endLocked(old)
		}
	}
	full := len(c.sessions) >= c.cfg.MaxSessions
	if full {
		s.end()
	} else {
		c.seq++
		s.seq = c.seq
		c.sessions[s.id] = s
	}
	c.mu.Unlock()
	if full {
		again(http.StatusServiceUnavailable, "The console holds as many sessions as it may; try again when some have ended.")
		return
	}
	// A browser-session cookie: the server decides when the session ends.
	http.SetCookie(w, &http.Cookie{
		Name: cookieName(r), Value: s.id, Path: "/",
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
	// The page this leads to carries the bind secret (render, action).
	http.Redirect(w, r, "/ui/tree", http.StatusSeeOther)
}

func (c *Console) signout(w http.ResponseWriter, r *http.Request, s *session) {
	c.mu.Lock()
	c.endLocked(s)
	c.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: cookieName(r), Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/ui/signin", http.StatusSeeOther)
}

// canStop: the roles the API lets terminate and revoke.
func (s *session) canStop() bool {
	return s.role == tetherv1.Role_ROLE_OPERATOR || s.role == tetherv1.Role_ROLE_SECURITY || s.role == tetherv1.Role_ROLE_ADMIN
}

// canOperate: the roles the API lets decide proposals and steer rollouts.
func (s *session) canOperate() bool {
	return s.role == tetherv1.Role_ROLE_OPERATOR || s.role == tetherv1.Role_ROLE_ADMIN
}

// view is what every template sees.
type view struct {
	Title   string
	Session *session
	CSRF    string
	Who     string
	Role    string
	Stop    bool
	Operate bool
	// Bind is the session's bind secret, in the first page rendered in
	// it alone (action).
	Bind string
	Data any
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, s *session, status int, page, title string, data any) {
	t := c.pages[page]
	v := view{Title: title, Session: s, Data: data}
	if s != nil {
		v.CSRF, v.Who, v.Role = s.csrf, s.principal, roleName(s.role)
		v.Stop, v.Operate = s.canStop(), s.canOperate()
		if s.bindShown.CompareAndSwap(false, true) {
			v.Bind = s.bind
		}
	}
	var buf strings.Builder
	if err := t.ExecuteTemplate(&buf, "layout", v); err != nil {
		c.cfg.Log.Error("console: render", "page", page, "error", err)
		http.Error(w, "the console could not render this page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(visible(buf.String())))
}

// failure is the error page's data.
type failure struct {
	Heading string
	Message string
}

func (c *Console) fail(w http.ResponseWriter, r *http.Request, s *session, status int, heading, message string) {
	c.render(w, r, s, status, "error", heading, failure{Heading: heading, Message: message})
}

// apiFail shows an API error as the server said it.
func (c *Console) apiFail(w http.ResponseWriter, r *http.Request, s *session, what string, err error) {
	status := http.StatusBadGateway
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument:
		status = http.StatusBadRequest
	case connect.CodeNotFound:
		status = http.StatusNotFound
	case connect.CodePermissionDenied:
		status = http.StatusForbidden
	case connect.CodeUnauthenticated:
		status = http.StatusUnauthorized
	case connect.CodeFailedPrecondition, connect.CodeAborted, connect.CodeAlreadyExists:
		status = http.StatusConflict
	case connect.CodeResourceExhausted:
		status = http.StatusTooManyRequests
	case connect.CodeUnavailable:
		status = http.StatusServiceUnavailable
	case connect.CodeCanceled:
		if r.Context().Err() != nil {
			return
		}
	}
	c.fail(w, r, s, status, what, errorText(err))
}

// errorText is the server's error as it said it: "code: message".
func errorText(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code().String() + ": " + ce.Message()
	}
	return err.Error()
}

// answered checks that an answer carries the object it answers (present),
// the one asked for (got is its id; asked "" asks for none in particular):
// the control plane's answers always do, and a page that read a forged
// one lacking it dereferenced nil, a panic in the control plane's own
// process, and one carrying another object drew that object's page
// under the id asked for. Its error is internal, shown as a bad gateway.
// (agentsdk.AnswerCarries, which the CLI's commands use too; here an
// object with no id counts as none.)
func answered(kind, asked, got string, present bool) error {
	if err := agentsdk.AnswerCarries(kind, asked, got, present && got != "", linked); err != nil {
		return connect.NewError(connect.CodeInternal, err)
	}
	return nil
}

// stale refuses an action whose page showed another state.
func (c *Console) stale(w http.ResponseWriter, r *http.Request, s *session, what, expected, now string) {
	c.fail(w, r, s, http.StatusConflict, "refused: the page was stale",
		fmt.Sprintf("%s is %s now, but the page you acted from showed %s. Nothing was done; look again before acting.", what, now, expected))
}

// ctx bounds a page's API calls.
func pageContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 30*time.Second)
}

// pageCall is apiCall for a page that makes only this call, with the
// page's deadline.
func pageCall[Req, Resp any](c *Console, w http.ResponseWriter, r *http.Request, s *session, what string, rpc func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error), req *Req) (*connect.Response[Resp], bool) {
	ctx, cancel := pageContext(r)
	defer cancel()
	return apiCall(ctx, c, w, r, s, what, rpc, req)
}

// apiCall makes one API call for a page; if it fails, it renders the
// failure (what could not be done) and reports false.
func apiCall[Req, Resp any](ctx context.Context, c *Console, w http.ResponseWriter, r *http.Request, s *session, what string, rpc func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error), req *Req) (*connect.Response[Resp], bool) {
	resp, err := rpc(ctx, connect.NewRequest(req))
	if err != nil {
		c.apiFail(w, r, s, what, err)
		return nil, false
	}
	return resp, true
}
