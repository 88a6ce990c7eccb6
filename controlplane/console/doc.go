// Package console is Tether's operator console: server-rendered pages under
// /ui/ of the control plane's own port, with a little JavaScript for live
// progress (server-sent events) and the tree's quick filter.
//
// The console holds no authority of its own. An operator signs in by pasting
// an operator token once; the console keeps it in a server-side session (a
// random id in an HttpOnly, SameSite=Strict cookie points at it; the token
// never appears in a URL, a page or a log) and reads and acts through the
// public Connect API with that token as the bearer, over an in-process
// transport that hands each request to the server's own HTTP handler. Every
// page therefore passes the same authentication, authorisation and rate
// limit as the CLI: a viewer sees everything a viewer may read and every
// action it tries is refused by the API, whatever the page showed.
// The live pages' event streams belong to their session: its end (sign-out,
// eviction, expiry) ends them, and each event is relayed only while the
// session lives.
//
// State-changing forms are POSTs checked three ways: the request must be
// same-origin (net/http's CrossOriginProtection: Sec-Fetch-Site, then
// Origin against Host), carry the session's CSRF token, and name the state
// the page showed (expected_state); the console reads the object again and
// refuses when it moved, so a stale page never acts on a node that changed.
//
// Agent credentials cannot sign in: the console is for operators.
package console
