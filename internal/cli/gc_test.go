package cli

import "testing"

func TestGCPercent_RelaysOwnUnlessGOGCIsSet(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		percent int
		set     bool
	}{
		{"GOGC unset", map[string]string{}, DefaultGCPercent, true},
		{"GOGC=100", map[string]string{"GOGC": "100"}, 0, false},
		{"GOGC=off", map[string]string{"GOGC": "off"}, 0, false},
		{"GOGC set empty", map[string]string{"GOGC": ""}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			percent, set := GCPercent(lookup)
			if percent != tc.percent || set != tc.set {
				t.Errorf("GCPercent = %d, %v; want %d, %v", percent, set, tc.percent, tc.set)
			}
		})
	}
}
