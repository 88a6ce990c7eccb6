package auth

import (
	"net/http"
	"testing"
)

// headerValue answers as http.Header.Get for the canonical keys it is
// asked for, whatever case the request wrote the header's name in (the
// servers, like Add, store it under its canonical key), empty values and
// repeated headers included (thirty-fifth pass perf).
func TestRogue35GHeaderValueIsGet(t *testing.T) {
	for _, key := range []string{"Authorization", "Content-Encoding", "Connect-Content-Encoding", "Grpc-Encoding"} {
		for _, tc := range []struct {
			name   string
			values []string
		}{
			{key, []string{"Bearer a.b.c"}},
			{"x-" + key, []string{"gzip"}}, // another header: absent
			{key, []string{"", "gzip"}},
			{key, []string{"gzip", "identity"}},
		} {
			for _, name := range []string{tc.name, "lower:" + tc.name} {
				h := http.Header{}
				n := name
				if len(n) > 6 && n[:6] == "lower:" {
					n = toLower(n[6:])
				}
				for _, v := range tc.values {
					h.Add(n, v)
				}
				if got, want := headerValue(h, key), h.Get(key); got != want {
					t.Errorf("header %q = %q: headerValue(%q) = %q, Get = %q", n, tc.values, key, got, want)
				}
			}
		}
		if got := headerValue(http.Header{}, key); got != "" {
			t.Errorf("no headers: headerValue(%q) = %q", key, got)
		}
	}
}

func toLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
