package format

import (
	"encoding/binary"
	"testing"
)

// bundleBytes builds a bundle of the given payloads, numbered from seq.
func bundleBytes(seq uint32, payloads ...[]byte) (Header, []byte) {
	var body []byte
	for i, p := range payloads {
		var rh [HeaderLen]byte
		(&Header{Type: Data, Flags: FlagFirst | FlagLast, Length: uint32(len(p)), Seq: seq + uint32(i)}).Put(rh[:])
		body = append(append(body, rh[:]...), p...)
	}
	return BundleHeader(seq, uint32(len(payloads)), uint32(len(body))), body
}

func TestCheckBundleRejects(t *testing.T) {
	good := func() (Header, []byte) { return bundleBytes(7, []byte("one"), []byte("two!"), nil) }
	h, b := good()
	if err := CheckBundle(&h, b); err != nil {
		t.Fatalf("a good bundle: %v", err)
	}
	var got []string
	for it := Bundled(b); it.Next(); {
		got = append(got, string(it.Data))
		if cap(it.Data) != len(it.Data) {
			t.Fatalf("message %d reaches past its end: cap %d, len %d", len(got)-1, cap(it.Data), len(it.Data))
		}
	}
	if len(got) != 3 || got[0] != "one" || got[1] != "two!" || got[2] != "" {
		t.Fatalf("a good bundle's messages: %q", got)
	}
	for name, mutate := range map[string]func(h *Header, b []byte) []byte{
		"one message":       func(h *Header, b []byte) []byte { h.Imm = 1; return b },
		"count too high":    func(h *Header, b []byte) []byte { h.Imm = 4; return b },
		"count too low":     func(h *Header, b []byte) []byte { h.Imm = 2; return b },
		"over the ring":     func(h *Header, b []byte) []byte { h.Imm = MaxBundle + 1; return b },
		"length off":        func(h *Header, b []byte) []byte { h.Length++; return b },
		"truncated":         func(h *Header, b []byte) []byte { h.Length--; return b[:len(b)-1] },
		"seq gap":           func(h *Header, b []byte) []byte { binary.BigEndian.PutUint32(b[HeaderLen+3+12:], 99); return b },
		"chunk inside":      func(h *Header, b []byte) []byte { b[1] = FlagFirst; return b },
		"control inside":    func(h *Header, b []byte) []byte { b[0] = byte(Credit); return b },
		"record past end":   func(h *Header, b []byte) []byte { binary.BigEndian.PutUint32(b[8:], 1000); return b },
		"trailing garbage":  func(h *Header, b []byte) []byte { h.Length += 3; return append(b, 1, 2, 3) },
		"bad record header": func(h *Header, b []byte) []byte { b[2] = 1; return b },
		"auth inside":       func(h *Header, b []byte) []byte { b[HeaderLen-1] = 1; return b },
	} {
		h, b := good()
		b = mutate(&h, b)
		if err := CheckBundle(&h, b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A bundle of MaxBundle messages is accepted, numbered across the wrap.
func TestCheckBundleFull(t *testing.T) {
	payloads := make([][]byte, MaxBundle)
	for i := range payloads {
		payloads[i] = []byte{byte(i)}
	}
	h, b := bundleBytes(^uint32(0)-3, payloads...)
	if err := CheckBundle(&h, b); err != nil {
		t.Fatalf("a bundle of %d: %v", MaxBundle, err)
	}
	k := 0
	for it := Bundled(b); it.Next(); k++ {
		if it.Header.Seq != ^uint32(0)-3+uint32(k) || len(it.Data) != 1 || it.Data[0] != byte(k) {
			t.Fatalf("message %d: seq %d, data %v", k, it.Header.Seq, it.Data)
		}
	}
	if k != MaxBundle {
		t.Fatalf("walked %d of %d messages", k, MaxBundle)
	}
}

// FuzzBundle: CheckBundle never panics, and what it accepts are messages
// that fill the payload, numbered on from the bundle's.
func FuzzBundle(f *testing.F) {
	h, b := bundleBytes(3, []byte("a"), []byte("bc"))
	f.Add(h.Seq, h.Imm, b)
	h, b = bundleBytes(^uint32(0), make([]byte, 100), nil, []byte{1})
	f.Add(h.Seq, h.Imm, b)
	f.Add(uint32(1), uint32(2), []byte("short"))
	f.Fuzz(func(t *testing.T, seq, count uint32, b []byte) {
		h := BundleHeader(seq, count, uint32(len(b)))
		if CheckBundle(&h, b) != nil {
			return
		}
		total, k := 0, uint32(0)
		for it := Bundled(b); it.Next(); k++ {
			if it.Header.Seq != seq+k || int(it.Header.Length) != len(it.Data) || !it.Header.Whole() {
				t.Fatalf("message %d: seq %d, %d bytes for length %d", k, it.Header.Seq, len(it.Data), it.Header.Length)
			}
			total += HeaderLen + len(it.Data)
		}
		if k != count || total != len(b) {
			t.Fatalf("accepted %d of %d messages over %d of %d bytes", k, count, total, len(b))
		}
	})
}
