// Package xcaddytest proves that `xcaddy build --with
// github.com/edgeplane/edgeplane=<repo>` produces a Caddy with every
// edgeplane module. It holds only a test, in its own package so that its
// slow build (about 3 minutes cold) runs in parallel with other packages.
package xcaddytest
