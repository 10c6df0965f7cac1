package maintenance

import (
	"context"
	"flag"
	"io"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Answer is what a maintenance command prints: as text, or as JSON.
type Answer interface{ WriteText(io.Writer) }

// Command adds the flags of `control maintenance VERB` (ls, on or off)
// to fs and returns what runs it, once fs is parsed, on the command
// line's arguments (NS [SERVICE] for on and off).
func Command(fs *flag.FlagSet, verb string) func(ctx context.Context, s *store.Store, args []string) (Answer, error) {
	if verb == "ls" {
		return func(ctx context.Context, s *store.Store, _ []string) (Answer, error) { return ReadList(ctx, s) }
	}
	on := verb == "on"
	wait := fs.Duration("wait", 0, "then wait, at most this long, until every live gateway applied the change (0: return once it is stored)")
	message, retry := new(string), new(time.Duration)
	if on {
		fs.StringVar(message, "message", "", "the text the 503 page shows (HTML-escaped; the JSON answer's message)")
		fs.DurationVar(retry, "retry-after", DefaultRetryAfter, "the Retry-After the 503 answer gives")
	}
	return func(ctx context.Context, s *store.Store, args []string) (Answer, error) {
		req := Request{Namespace: args[0], On: on, Message: *message, RetryAfter: *retry, Wait: *wait}
		if len(args) > 1 {
			req.Service = args[1]
		}
		return Set(ctx, s, req)
	}
}
