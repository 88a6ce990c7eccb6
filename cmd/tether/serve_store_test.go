package main

import (
	"net"
	"os"
	"testing"
)

func TestAdvertiseURL(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Skip("no host name:", err)
	}
	tcp := func(s string) net.Addr {
		a, err := net.ResolveTCPAddr("tcp", s)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	for _, tc := range []struct {
		flag, scheme string
		addr         net.Addr
		want         string
	}{
		{"", "http", tcp("127.0.0.1:7420"), "http://127.0.0.1:7420"},
		{"", "https", tcp("10.1.2.3:443"), "https://10.1.2.3:443"},
		// Nobody can dial an unspecified address: the host name stands in.
		{"", "http", tcp("0.0.0.0:7420"), "http://" + net.JoinHostPort(host, "7420")},
		{"", "http", tcp("[::]:7420"), "http://" + net.JoinHostPort(host, "7420")},
		{"http://tether-0.tether-headless.ns.svc:7420/", "http", tcp("0.0.0.0:7420"), "http://tether-0.tether-headless.ns.svc:7420"},
	} {
		got, err := advertiseURL(tc.flag, tc.scheme, tc.addr)
		if err != nil || got != tc.want {
			t.Errorf("advertiseURL(%q, %q, %s) = %q, %v; want %q", tc.flag, tc.scheme, tc.addr, got, err, tc.want)
		}
	}
	for _, bad := range []string{"10.0.0.1:7420", "ftp://10.0.0.1", "http://", "http://10.0.0.1:7420/api"} {
		if got, err := advertiseURL(bad, "http", tcp("127.0.0.1:7420")); err == nil {
			t.Errorf("--advertise-url %q was accepted as %q", bad, got)
		}
	}
}
