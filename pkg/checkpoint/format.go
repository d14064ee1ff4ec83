package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// CurrentVersion is the format version this Tessera writes.
const CurrentVersion = "v1"

// currentMajor and currentMinor are the numbers of CurrentVersion ("v1" is
// minor 0). A minor version "vN.M" of the same major may only add members
// (top level, in claims, in devices) that an older reader can ignore: it
// keeps the checksum rule and the meaning of every member this one reads.
const (
	currentMajor = 1
	currentMinor = 0
)

const checksumPrefix = "sha256:"

// ErrNewerVersion is wrapped by the error [Open] returns for a checkpoint
// written by a newer Tessera. The file is left untouched.
var ErrNewerVersion = errors.New("checkpoint written by a newer Tessera")

// content is a decoded checkpoint, whatever version it was read from.
type content struct {
	Version string // the version found in the file
	// NewerMinor is set when Version is a newer minor of the current major,
	// read by the current version's reader (members it does not know were
	// ignored).
	NewerMinor bool
	BootID     string
	Claims     map[types.UID]Claim
}

// reader decodes the top-level members of a file of one version; it also
// verifies that version's checksum.
type reader func(top map[string]json.RawMessage) (content, error)

// readers has one entry for every version any Tessera release wrote. Never
// remove one: that is the upgrade guarantee (see testdata/).
var readers = map[string]reader{
	"v1": readV1,
}

// corruptError says why a file could not be read; Open moves such a file aside.
type corruptError struct{ reason string }

func (e *corruptError) Error() string { return e.reason }

func corrupt(format string, args ...any) error {
	return &corruptError{reason: fmt.Sprintf(format, args...)}
}

// newerError is a version from the future.
type newerError struct{ version string }

func (e *newerError) Error() string {
	return fmt.Sprintf("format version %s, this Tessera reads up to %s", e.version, CurrentVersion)
}

func (e *newerError) Unwrap() error { return ErrNewerVersion }

// decode reads a checkpoint of any known version, or of a newer minor of the
// current major (with the current version's reader). Errors are
// *corruptError or *newerError.
func decode(data []byte) (content, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return content{}, corrupt("not a valid JSON object (truncated?): %v", err)
	}
	version, err := stringMember(top, "version")
	if err != nil {
		return content{}, err
	}
	newerMinor := false
	read, ok := readers[version]
	if !ok {
		if major, ok := parseMajor(version); ok && major > currentMajor {
			return content{}, &newerError{version: version}
		}
		major, minor, ok := parseVersion(version)
		if !ok || major != currentMajor || minor <= currentMinor {
			return content{}, corrupt("unknown format version %q", version)
		}
		read, newerMinor = readers[CurrentVersion], true
	}
	c, err := read(top)
	if err != nil {
		return content{}, err
	}
	c.Version, c.NewerMinor = version, newerMinor
	return c, nil
}

// parseVersion returns N and M for "vN.M", and N and 0 for "vN" (digits
// only, no suffix).
func parseVersion(version string) (major, minor int, ok bool) {
	rest, ok := strings.CutPrefix(version, "v")
	if !ok {
		return 0, 0, false
	}
	majorStr, minorStr, dotted := strings.Cut(rest, ".")
	if major, ok = parseDigits(majorStr); !ok {
		return 0, 0, false
	}
	if !dotted {
		return major, 0, true
	}
	if minor, ok = parseDigits(minorStr); !ok {
		return 0, 0, false
	}
	return major, minor, true
}

// parseDigits parses a non-empty string of ASCII digits.
func parseDigits(s string) (int, bool) {
	if s == "" || strings.Trim(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// parseMajor returns N for "vN" or "vN<suffix>" (v2, v2beta1).
func parseMajor(version string) (int, bool) {
	rest, ok := strings.CutPrefix(version, "v")
	if !ok {
		return 0, false
	}
	end := 0
	for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
		end++
	}
	n, err := strconv.Atoi(rest[:end])
	if err != nil {
		return 0, false
	}
	return n, true
}

// checksumOf computes the checksum over every member of top except
// "checksum": compact JSON, members sorted by name (as encoding/json writes
// a map), so whitespace in the file does not matter.
func checksumOf(top map[string]json.RawMessage) (string, error) {
	rest := make(map[string]json.RawMessage, len(top))
	for k, v := range top {
		if k != "checksum" {
			rest[k] = v
		}
	}
	canonical, err := json.Marshal(rest)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(canonical)
	return checksumPrefix + hex.EncodeToString(sum[:]), nil
}

// stringMember reads the string member name of a checkpoint's top-level
// object; its absence or another type is a *corruptError.
func stringMember(top map[string]json.RawMessage, name string) (string, error) {
	raw, ok := top[name]
	if !ok {
		return "", corrupt("no %q member", name)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", corrupt("%q is not a string: %v", name, err)
	}
	return s, nil
}

// readV1 reads v1 and every newer minor of it (v1.M): it reads the members
// it knows and ignores the others, which the checksum still covers.
func readV1(top map[string]json.RawMessage) (content, error) {
	sum, err := stringMember(top, "checksum")
	if err != nil {
		return content{}, err
	}
	want, err := checksumOf(top)
	if err != nil {
		return content{}, corrupt("computing checksum: %v", err)
	}
	if sum != want {
		return content{}, corrupt("checksum mismatch: file says %q, content hashes to %q", sum, want)
	}

	var c content
	if raw, ok := top["bootID"]; ok {
		if err := json.Unmarshal(raw, &c.BootID); err != nil {
			return content{}, corrupt("\"bootID\": %v", err)
		}
	}
	// Unknown fields inside claims are ignored: the checksum already proves
	// the file is what a Tessera wrote.
	var claims map[types.UID]Claim
	if raw, ok := top["claims"]; ok {
		if err := json.Unmarshal(raw, &claims); err != nil {
			return content{}, corrupt("\"claims\": %v", err)
		}
	}
	c.Claims = make(map[types.UID]Claim, len(claims))
	for uid, claim := range claims {
		if claim.UID != uid {
			return content{}, corrupt("claim under key %q has uid %q", uid, claim.UID)
		}
		cfg, err := compactConfig(claim.Config)
		if err != nil {
			return content{}, corrupt("claim %s: config: %v", claim, err)
		}
		claim.Config = cfg
		c.Claims[uid] = claim
	}
	return c, nil
}

// encodedClaim is one claim as the file holds it: its key (the UID as a
// JSON string), its compact encoding, which the checksum covers, and its
// encoding indented as it appears in the file.
type encodedClaim struct {
	key, compact, indented []byte
}

// encodeClaim encodes c the way json.Marshal and json.MarshalIndent encode
// it as a value of the claims map.
func encodeClaim(c Claim) (encodedClaim, error) {
	key, err := json.Marshal(string(c.UID))
	if err != nil {
		return encodedClaim{}, err
	}
	compact, err := json.Marshal(c)
	if err != nil {
		return encodedClaim{}, fmt.Errorf("encode claim %s: %w", c, err)
	}
	var indented bytes.Buffer
	indented.Grow(len(compact) * 2)
	// A claim sits two levels deep in the file, under "claims".
	if err := json.Indent(&indented, compact, "    ", "  "); err != nil {
		return encodedClaim{}, fmt.Errorf("encode claim %s: %w", c, err)
	}
	return encodedClaim{key: key, compact: compact, indented: indented.Bytes()}, nil
}

// encodeClaims encodes every claim of claims.
func encodeClaims(claims map[types.UID]Claim) (map[types.UID]encodedClaim, error) {
	enc := make(map[types.UID]encodedClaim, len(claims))
	for uid, c := range claims {
		e, err := encodeClaim(c)
		if err != nil {
			return nil, err
		}
		enc[uid] = e
	}
	return enc, nil
}

// encode writes claims in the current version.
func encode(bootID string, claims map[types.UID]Claim) ([]byte, error) {
	enc, err := encodeClaims(claims)
	if err != nil {
		return nil, err
	}
	return encodeFrom(bootID, enc)
}

// encodeFrom writes a file in the current version from claims already
// encoded one by one, so that a write re-encodes only the claims that
// changed. It writes the members in the order version, bootID, checksum,
// claims, indented, exactly as json.MarshalIndent would (keys of the claims
// map sorted as encoding/json sorts them), and builds the checksum input,
// the compact form checksumOf computes, from the same pieces.
func encodeFrom(bootID string, enc map[types.UID]encodedClaim) ([]byte, error) {
	versionJSON, err := json.Marshal(CurrentVersion)
	if err != nil {
		return nil, err
	}
	bootJSON, err := json.Marshal(bootID)
	if err != nil {
		return nil, err
	}
	uids := make([]types.UID, 0, len(enc))
	size := 0
	for uid, e := range enc {
		uids = append(uids, uid)
		size += len(e.key) + len(e.indented) + 16
	}
	slices.Sort(uids)

	// The canonical form checksumOf computes: members sorted by name,
	// compact, the claims map with its keys sorted.
	h := sha256.New()
	h.Write([]byte(`{"bootID":`))
	h.Write(bootJSON)
	h.Write([]byte(`,"claims":{`))
	for i, uid := range uids {
		if i > 0 {
			h.Write([]byte(","))
		}
		e := enc[uid]
		h.Write(e.key)
		h.Write([]byte(":"))
		h.Write(e.compact)
	}
	h.Write([]byte(`},"version":`))
	h.Write(versionJSON)
	h.Write([]byte(`}`))
	sumJSON, err := json.Marshal(checksumPrefix + hex.EncodeToString(h.Sum(nil)))
	if err != nil {
		return nil, err
	}

	var buf bytes.Buffer
	buf.Grow(size + 256)
	buf.WriteString("{\n  \"version\": ")
	buf.Write(versionJSON)
	buf.WriteString(",\n  \"bootID\": ")
	buf.Write(bootJSON)
	buf.WriteString(",\n  \"checksum\": ")
	buf.Write(sumJSON)
	buf.WriteString(",\n  \"claims\": {")
	for i, uid := range uids {
		if i > 0 {
			buf.WriteByte(',')
		}
		e := enc[uid]
		buf.WriteString("\n    ")
		buf.Write(e.key)
		buf.WriteString(": ")
		buf.Write(e.indented)
	}
	if len(uids) > 0 {
		buf.WriteString("\n  ")
	}
	buf.WriteString("}\n}\n")
	return buf.Bytes(), nil
}
