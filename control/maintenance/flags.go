package maintenance

import (
	"flag"
	"time"
)

// Flags adds the flags of `control maintenance on` (on) or `off` to fs
// and returns what makes the Request of a command line's arguments (NS
// [SERVICE]) once fs is parsed.
func Flags(fs *flag.FlagSet, on bool) func(args []string) Request {
	wait := fs.Duration("wait", 0, "then wait, at most this long, until every live gateway applied the change (0: return once it is stored)")
	message, retry := new(string), new(time.Duration)
	if on {
		fs.StringVar(message, "message", "", "the text the 503 page shows (HTML-escaped; the JSON answer's message)")
		fs.DurationVar(retry, "retry-after", DefaultRetryAfter, "the Retry-After the 503 answer gives")
	}
	return func(args []string) Request {
		req := Request{Namespace: args[0], On: on, Message: *message, RetryAfter: *retry, Wait: *wait}
		if len(args) > 1 {
			req.Service = args[1]
		}
		return req
	}
}
