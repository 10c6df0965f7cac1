package relay

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/pion/turn/v4"
)

// maxUsername is STUN's limit on USERNAME (RFC 8489 section 14.3).
const maxUsername = 513

// Credentials returns TURN REST credentials for machine, valid for ttl: the
// username "<unix expiry>:<machine>" and the password base64(HMAC-SHA1(secret,
// username)), which is what the relay's auth handler recomputes. The relay
// refuses them once expires has passed, on every request (refreshes
// included), so an allocation dies within its lifetime (at most 10 minutes)
// after its credentials expire: callers allocate again with fresh ones
// before then.
func Credentials(secret []byte, machine string, ttl time.Duration) (username, password string, expires time.Time, err error) {
	switch {
	case len(secret) == 0:
		return "", "", time.Time{}, errors.New("relay credentials: empty secret")
	case machine == "":
		return "", "", time.Time{}, errors.New("relay credentials: empty machine name")
	case ttl <= 0:
		return "", "", time.Time{}, fmt.Errorf("relay credentials: ttl %v is not positive", ttl)
	}
	// pion's generator is the exact counterpart of the LongTermTURNRESTAuthHandler
	// the server uses, so the two cannot drift apart.
	username, password, err = turn.GenerateLongTermTURNRESTCredentials(string(secret), machine, ttl)
	if err != nil {
		return "", "", time.Time{}, fmt.Errorf("relay credentials for %s: %w", machine, err)
	}
	if len(username) > maxUsername {
		return "", "", time.Time{}, fmt.Errorf("relay credentials: machine name of %d bytes is too long for a STUN username", len(machine))
	}
	stamp, _, _ := strings.Cut(username, ":")
	unix, err := strconv.ParseInt(stamp, 10, 64)
	if err != nil {
		return "", "", time.Time{}, fmt.Errorf("relay credentials: parsing the expiry of %q: %w", username, err)
	}
	return username, password, time.Unix(unix, 0), nil
}
