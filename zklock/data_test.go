package zklock

import (
	"bytes"
	"strconv"
	"testing"
	"time"
)

// FuzzData checks that a node's data reads back as written, whatever the value
// (newlines and spaces included) and with or without a semaphore holder's mark, that a node without a value is written as older
// versions wrote it, and that the data of an older version reads as a TTL without
// a value.
func FuzzData(f *testing.F) {
	f.Add(int64(30000), int64(0), false, []byte(nil))
	f.Add(int64(30000), int64(1767225600000), false, []byte("10.0.0.7:8080"))
	f.Add(int64(1), int64(5), false, []byte("a\nb c\n"))
	f.Add(int64(15000), int64(0), false, []byte("\n"))
	f.Add(int64(15000), int64(0), true, []byte(nil))
	f.Add(int64(15000), int64(1767225600000), true, []byte("h"))
	f.Fuzz(func(t *testing.T, ms, base int64, held bool, value []byte) {
		if ms <= 0 || ms > int64(time.Hour*24*365/time.Millisecond) || base < 0 {
			t.Skip()
		}
		ttl := time.Duration(ms) * time.Millisecond
		data := encodeData(ttl, base, held, value)
		d := decodeData(data)
		if d.ttl != ttl || d.base != base || d.held != held || !bytes.Equal(d.value, value) || (len(value) == 0) != (d.value == nil) {
			t.Fatalf("encodeData(%v, %d, %v, %q) = %q reads as %+v", ttl, base, held, value, data, d)
		}
		if base == 0 && !held && len(value) == 0 && string(data) != strconv.FormatInt(ms, 10) {
			t.Fatalf("data without a value or base = %q, want the TTL alone", data)
		}
	})
}

// Data of an older version: the TTL alone.
func TestDecodeOldData(t *testing.T) {
	for data, want := range map[string]nodeData{
		"30000":                              {ttl: 30 * time.Second},
		"":                                   {},
		"x":                                  {},
		"-5":                                 {},
		"30000 1767225600000 later-field\nv": {ttl: 30 * time.Second, base: 1767225600000, value: []byte("v")},
		"30000 0 h later-field":              {ttl: 30 * time.Second, held: true},
	} {
		d := decodeData([]byte(data))
		if d.ttl != want.ttl || d.base != want.base || d.held != want.held || !bytes.Equal(d.value, want.value) {
			t.Errorf("decodeData(%q) = %+v, want %+v", data, d, want)
		}
	}
}
