package printers

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Signers writes the trust root and the signers it certified; refused are
// certificates it did not sign.
func Signers(w io.Writer, root, source string, signers []store.SignerRecord, refused []string) {
	fmt.Fprintf(w, "trust root %s (%s)\n", root, source)
	tw := table(w)
	fmt.Fprintln(tw, "SIGNER\tNAME\tISSUED\tSTATE")
	for _, r := range signers {
		state := "active"
		if r.Retired != nil {
			var b strings.Builder
			b.WriteString("retired")
			if r.RetiredAt != nil {
				b.WriteString(" " + r.RetiredAt.Format(time.RFC3339))
			}
			state = b.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Key, r.Name, r.IssuedAt.Format(time.RFC3339), state)
	}
	tw.Flush()
	for _, r := range refused {
		fmt.Fprintf(w, "refused: %s\n", r)
	}
}

// Credentials writes the recorded keys issued to boxes, each valid,
// expired or revoked as of now.
func Credentials(w io.Writer, list []store.IssuedCredential) {
	tw := table(w)
	fmt.Fprintln(tw, "USER\tROLE\tMACHINE\tNAME\tHOW\tISSUED\tEXPIRES\tSTATE")
	now := time.Now()
	for _, r := range list {
		exp, state := "never", "valid"
		if !r.ExpiresAt.IsZero() {
			exp = r.ExpiresAt.Format(time.RFC3339)
			if now.After(r.ExpiresAt) {
				state = "expired"
			}
		}
		if !r.RevokedAt.IsZero() {
			state = "revoked " + r.RevokedAt.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.User, r.Role, Dash(r.Machine), Dash(r.Name), r.How,
			r.IssuedAt.Format(time.RFC3339), exp, state)
	}
	_ = tw.Flush()
}
