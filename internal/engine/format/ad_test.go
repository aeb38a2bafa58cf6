package format

import "testing"

func TestAd(t *testing.T) {
	for _, a := range []Ad{
		{Addr: 0, RKey: 0x1234, Length: 4096, Access: AccessRead | AccessWrite},
		{Addr: 1 << 40, RKey: ^uint32(0), Length: 1, Access: AccessRead},
		{Addr: ^uint64(0) - 10, Length: 10, Access: AccessWrite}, // ends at the top, no wrap
	} {
		var b [AdLen]byte
		a.Put(b[:])
		got, err := ParseAd(b[:])
		if err != nil || got != a {
			t.Errorf("%+v: parsed as %+v, %v", a, got, err)
		}
	}
	for name, a := range map[string]Ad{
		"empty":          {Length: 0, Access: AccessRead},
		"unknown access": {Length: 1, Access: 4},
		"wraps":          {Addr: ^uint64(0) - 9, Length: 10, Access: AccessRead},
	} {
		var b [AdLen]byte
		a.Put(b[:])
		if _, err := ParseAd(b[:]); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := ParseAd(make([]byte, AdLen+1)); err == nil {
		t.Error("a long ad: accepted")
	}
}

// FuzzAd: ParseAd never panics, and what it accepts is a region that does
// not wrap, and re-encodes to the same bytes.
func FuzzAd(f *testing.F) {
	var b [AdLen]byte
	(&Ad{RKey: 7, Length: 4096, Access: AccessRead}).Put(b[:])
	f.Add(b[:])
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseAd(b)
		if err != nil {
			return
		}
		if a.Length == 0 || a.Addr+a.Length < a.Addr || a.Access&^(AccessRead|AccessWrite) != 0 {
			t.Fatalf("accepted %+v", a)
		}
		var out [AdLen]byte
		a.Put(out[:])
		if string(out[:]) != string(b) {
			t.Fatalf("re-encoded %x as %x", b, out)
		}
	})
}
