package controlplane

import "net/http"

// stackReserve is how much stack a request's goroutine is given before it
// enters the handler chain. net/http starts every HTTP/2 request on a new
// goroutine with a small stack, and an RPC's path (the middleware, Connect,
// the interceptors, a handler and a store read) outgrows it two or three
// times; each growth copies the stack and walks all its frames to adjust
// them, which profiled at about a tenth of the server's CPU per unary call.
// Reserving the stack at the top of the chain, where it is still shallow,
// costs one growth of a few frames instead.
const stackReserve = 8 << 10

// withStack grows each request's goroutine stack (stackReserve) before it
// calls next.
func withStack(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		growStack()
		next.ServeHTTP(w, r)
	})
}

// growStackTouch is never set and growStackOut never read: they keep the
// compiler from dropping growStack's frame.
var (
	growStackTouch bool
	growStackOut   byte
)

// growStack has a frame of stackReserve bytes, so calling it makes the
// runtime grow the goroutine's stack at once to a size that holds it (the
// runtime doubles the stack until the frame fits). The array is declared
// inside the branch that is never taken: the frame is sized for it all the
// same (a function's frame is fixed at compile time, and the prologue's
// stack check asks for all of it), but the compiler zeroes it only where it
// is declared, so no call pays to clear 8 KiB it never reads (a REP STOSQ
// of 1,024 words on every request, where the array was declared at the
// top).
//
//go:noinline
func growStack() {
	if growStackTouch {
		var buf [stackReserve]byte
		for i := range buf {
			buf[i] = byte(i)
		}
		growStackOut = buf[len(buf)-1]
	}
}
