package v1alpha1

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Bounds on a quantity the decoders hand to resource.Quantity. Parsing costs
// apimachinery's Quantity time that grows with the exponent and the number of
// digits ("1e-99999999" takes most of a minute); no memory size comes near them.
const (
	maxQuantityExponent = 1000
	maxQuantityLength   = 64
)

// quantityFields names the JSON keys whose values decode into a resource.Quantity.
var quantityFields = map[string]bool{"memoryLimit": true}

// checkQuantityExponents walks the tokens of the JSON document js and rejects a
// value of a quantityFields key that is longer than maxQuantityLength or whose
// exponent is beyond maxQuantityExponent, before the decoder parses it. Keys are matched after unescaping, as the decoder
// matches them. Malformed JSON is left for the serializer to report.
func checkQuantityExponents(js []byte) error {
	type frame struct {
		object    bool
		expectKey bool
		key       string
	}
	var stack []frame
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		if delim, ok := tok.(json.Delim); ok && (delim == '}' || delim == ']') {
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
			continue
		}
		var parent *frame
		if len(stack) > 0 {
			parent = &stack[len(stack)-1]
		}
		if parent != nil && parent.object && parent.expectKey {
			if key, ok := tok.(string); ok {
				parent.key, parent.expectKey = key, false
			}
			continue
		}
		inQuantity := false
		if parent != nil && parent.object {
			inQuantity = quantityFields[parent.key]
			parent.expectKey = true
		}
		var value string
		switch t := tok.(type) {
		case json.Delim:
			stack = append(stack, frame{object: t == '{', expectKey: t == '{'})
			continue
		case string:
			value = t
		case json.Number:
			value = t.String()
		default:
			continue
		}
		if !inQuantity {
			continue
		}
		problem := ""
		if len(value) > maxQuantityLength {
			problem = fmt.Sprintf("must be at most %d characters", maxQuantityLength)
			value = value[:20] + "..."
		} else if exp, ok := quantityExponent(value); ok && (exp > maxQuantityExponent || exp < -maxQuantityExponent) {
			problem = fmt.Sprintf("the exponent must be between -%d and %d", maxQuantityExponent, maxQuantityExponent)
		}
		if problem != "" {
			keys := make([]string, 0, len(stack))
			for _, f := range stack {
				if f.object {
					keys = append(keys, f.key)
				}
			}
			return fmt.Errorf("%s: Invalid value: %q: %s", strings.Join(keys, "."), value, problem)
		}
	}
}

// quantityExponent returns the decimal exponent of a quantity written in
// scientific notation ("1.5e9" → 9). ok is false for any other form, including
// exponents too long to be an int, which are reported as out of range.
func quantityExponent(s string) (exp int64, ok bool) {
	s = strings.TrimLeft(s, "+-")
	i := strings.IndexAny(s, "eE")
	if i < 0 || i+1 == len(s) {
		return 0, false // no exponent, or the suffix E (exa)
	}
	digits := s[i+1:]
	unsigned := strings.TrimLeft(digits, "+-")
	if len(unsigned) == 0 || len(digits)-len(unsigned) > 1 || strings.Trim(unsigned, "0123456789") != "" {
		return 0, false
	}
	exp, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		// Too many digits for an int64: certainly out of range.
		if strings.HasPrefix(digits, "-") {
			return -maxQuantityExponent - 1, true
		}
		return maxQuantityExponent + 1, true
	}
	return exp, true
}
