package redisstore

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/limitry/ratelimit/core"
)

// MaxKeyLen is the longest request key, and the longest hash tag, the store
// writes into a Redis key as it is. A longer key is replaced by "%h:" and
// the hex SHA-256 of the key, a longer tag by "%h" and the hex SHA-256 of
// the tag (see the package documentation), so a hostile key costs Redis
// at most a fixed number of bytes per record, also when Config.HashTag
// tags by the key (TagByKey).
const MaxKeyLen = 256

// Key layout. A request's Redis key is
//
//	Prefix + name + ":" + key                    (no hash tag, key without '{')
//	Prefix + "{}" + name + ":" + key             (no hash tag, key with '{')
//	Prefix + "{" + tag + "}" + name + ":" + key  (Config.HashTag returned tag != "")
//
// where name is the policy's Name and tag the hash tag, each with '%', ':'
// (name only), '{' and '}' written as %25, %3A, %7B and %7D. Neither can
// then hold the separator that ends it, so distinct (tag, name, key)
// triples never share a Redis key, and a name or tag never opens a hash
// tag of its own. The request key is written as it is when it is at most
// MaxKeyLen bytes long; a longer key is written as "%h:" + hex(SHA-256(key))
// after the name in place of ":" + key (an escaped name never ends in a
// bare '%', so this never equals another name's key). Likewise a tag
// longer than MaxKeyLen bytes is written as "%h" + hex(SHA-256(tag)), which
// no escaped tag equals (its '%' would be written %25); one tag is always
// written the same way, so it still puts every key it tags in one slot.
// The empty hash tag "{}" in front of a key holding '{' makes Redis
// Cluster hash the whole key: a caller-supplied key never chooses its slot
// by holding "{...}"; only Config.HashTag chooses slots.

// escapeName escapes a policy name for a Redis key.
func escapeName(s string) string {
	return escape(s, true)
}

// escape writes '%', '{', '}' and, if colon is set, ':' as %XX. It
// returns s itself when nothing needs escaping.
func escape(s string, colon bool) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if needsEscape(s[i], colon) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if needsEscape(c, colon) {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func needsEscape(c byte, colon bool) bool {
	return c == '%' || c == '{' || c == '}' || (colon && c == ':')
}

// redisKey returns the Redis key of r under prefix, with the policy's
// escaped name en and the (unescaped) hash tag tag.
func redisKey(prefix, en, tag string, r *core.Request) string {
	sep, key := ":", r.Key
	if len(key) > MaxKeyLen {
		sum := sha256.Sum256([]byte(key))
		sep, key = "%h:", hex.EncodeToString(sum[:])
	}
	if tag == "" {
		if strings.IndexByte(key, '{') >= 0 {
			return prefix + "{}" + en + sep + key
		}
		return prefix + en + sep + key
	}
	if len(tag) > MaxKeyLen {
		sum := sha256.Sum256([]byte(tag))
		return prefix + "{%h" + hex.EncodeToString(sum[:]) + "}" + en + sep + key
	}
	return prefix + "{" + escape(tag, false) + "}" + en + sep + key
}

// hashTagOf returns the part of key Redis Cluster hashes: the content of
// the first "{...}" if it is not empty, otherwise the whole key.
func hashTagOf(key string) string {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			return key[s+1 : s+1+e]
		}
	}
	return key
}

// slot returns the Redis Cluster hash slot (0 to 16383) of a key, as the
// CLUSTER KEYSLOT command computes it: CRC16 (XMODEM) of the key's hash
// tag, or of the whole key when it has none, modulo 16384.
func slot(key string) int {
	return int(crc16(hashTagOf(key)) & 16383)
}

var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for j := 0; j < 8; j++ {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the
// checksum Redis Cluster uses for key slots.
func crc16(s string) uint16 {
	var c uint16
	for i := 0; i < len(s); i++ {
		c = c<<8 ^ crcTable[byte(c>>8)^s[i]]
	}
	return c
}
