package version

import "testing"

func TestOrder(t *testing.T) {
	for _, c := range []struct {
		a, b  string
		older bool
	}{
		{"1.2.3", "1.2.4", true},
		{"1.2.4", "1.2.3", false},
		{"1.9.0", "1.10.0", true},
		{"v2.0.0", "1.99.99", false},
		{"1.2.0-rc1", "1.2.0", true},
		{"1.2.0", "1.2.0-rc1", false},
		{"1.2.0-rc1", "1.2.0-rc2", true},
		{"1.2.0", "1.2.0", false},
		{"dev", "0.0.1", true},
		{"0.0.1", "dev", false},
		{"dev", "dev", false},
	} {
		if got := Older(c.a, c.b); got != c.older {
			t.Errorf("Older(%q, %q) = %v, want %v", c.a, c.b, got, c.older)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for _, v := range []string{"", "dev", "1.2", "1.2.3.4", "1.x.3", "01.2.3", "1.2.3-", "1.2.3-a/b", "-1.2.3", "1.2.3-rc.1", "1.2.3-*", "1.2.3->"} {
		if _, err := Parse(v); err == nil {
			t.Errorf("Parse(%q) accepted", v)
		}
	}
}
