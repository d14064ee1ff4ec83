package webhook

import (
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// checkLimits bounds the work of the checks, but only once the object has
// been decoded: decoding itself costs memory in proportion to the elements
// it creates, not to the bytes it reads ("firstAvailable":[{},{},…] is 3
// bytes an element in the body and ~136 bytes decoded, so a 4 MiB body
// would make ~190 MB live). checkShape therefore scans the raw object first,
// in one pass over its bytes and without allocating, and refuses it before
// any typed decode when it holds lists or nesting that no object the API
// server stores can hold.
const (
	// maxShapeList bounds the elements of any one list outside the object's
	// metadata: the largest list size resource.k8s.io/v1 allows for any
	// field of a ResourceClaim, template or DeviceClass, which is
	// status.reservedFor (ResourceClaimReservedForMaxSize, 256); the lists of
	// the spec are smaller (requests, constraints, config, selectors: 32;
	// tolerations 16; firstAvailable 8), and checkLimits holds each of those
	// to its own size after decoding. Opaque parameters are scanned too
	// (they are part of the object): GpuConfig has no list near this size.
	maxShapeList = resourceapi.ResourceClaimReservedForMaxSize
	// maxShapeElements bounds the list elements of the whole object, metadata
	// included (finalizers, ownerReferences and managedFields have no count
	// limit of their own): lists nested in lists (requests × firstAvailable
	// × tolerations) would otherwise multiply past what maxShapeList bounds.
	// A largest valid claim has about 16k (32 requests × 8 alternatives ×
	// 48 selectors and tolerations, plus request references).
	maxShapeElements = 1 << 16
	// maxShapeDepth bounds nesting. Objects of resource.k8s.io are about 10
	// levels deep, their managedFields about as deep again.
	maxShapeDepth = 64
)

// shapeFrame is one open array or object of the scan.
type shapeFrame struct {
	array bool
	// pending: the next value starts an element (array) or is a key (object).
	pending bool
	// metadata: this container is, or is inside, the object's metadata.
	metadata bool
	n        int
	// key is the object's current key, as spelled in the body.
	key []byte
}

// checkShape scans the JSON object raw without decoding it and returns an
// error (with the field path, as far as the scan got) for a list of more
// than maxShapeList elements outside the top-level metadata, more than
// maxShapeElements list elements in all, or nesting deeper than
// maxShapeDepth. It is O(len(raw)) and does not allocate unless it refuses.
// It does not check that raw is valid JSON: the decoder that runs after it
// does; on malformed input it only stops early or counts loosely.
func checkShape(raw []byte) *field.Error {
	var stack [maxShapeDepth]shapeFrame
	depth, total := 0, 0
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch c {
		case ' ', '\t', '\n', '\r', ':':
			continue
		case ',':
			if depth > 0 {
				stack[depth-1].pending = true
			}
			continue
		case ']', '}':
			if depth > 0 {
				depth--
			}
			continue
		}
		// c starts a value, or an object's key.
		metadata := false
		if depth > 0 {
			f := &stack[depth-1]
			metadata = f.metadata
			if f.pending {
				f.pending = false
				if !f.array {
					if c == '"' {
						end := skipString(raw, i)
						f.key = raw[i+1 : max(i+1, end)]
						i = end
					}
					continue
				}
				f.n++
				total++
				if f.n > maxShapeList && !f.metadata {
					return field.TooMany(shapePath(stack[:depth], false), -1, maxShapeList)
				}
				if total > maxShapeElements {
					return field.Forbidden(shapePath(stack[:depth], false),
						fmt.Sprintf("the object holds more than %d list elements in all", maxShapeElements))
				}
			} else if depth == 1 && !f.array {
				// The value of a top-level key: metadata's subtree is exempt
				// from maxShapeList.
				metadata = string(f.key) == "metadata"
			}
		}
		switch c {
		case '"':
			i = skipString(raw, i)
		case '[', '{':
			if depth == maxShapeDepth {
				return field.Forbidden(shapePath(stack[:depth], true),
					fmt.Sprintf("nested more than %d levels deep", maxShapeDepth))
			}
			stack[depth] = shapeFrame{array: c == '[', pending: true, metadata: metadata}
			depth++
		}
	}
	return nil
}

// skipString returns the index of the quote that ends the string whose
// opening quote is at raw[start] (len(raw) if it does not end).
func skipString(raw []byte, start int) int {
	for i := start + 1; i < len(raw); i++ {
		switch raw[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return len(raw)
}

// shapePath is the field path of the innermost of frames (with the index of
// its current element when withIndex, or when it is not the innermost).
func shapePath(frames []shapeFrame, withIndex bool) *field.Path {
	var p *field.Path
	for i, f := range frames {
		innermost := i == len(frames)-1
		switch {
		case f.array && (withIndex || !innermost):
			if p == nil {
				p = field.NewPath("")
			}
			p = p.Index(max(f.n-1, 0))
		case !f.array && (withIndex || !innermost) && len(f.key) > 0:
			if p == nil {
				p = field.NewPath(string(f.key))
			} else {
				p = p.Child(string(f.key))
			}
		}
	}
	if p == nil {
		p = field.NewPath("<object>")
	}
	return p
}

// shapeDenial denies req when its object fails checkShape, naming the limit;
// nil when the object passes.
func shapeDenial(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if err := checkShape(req.Object.Raw); err != nil {
		return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: false, Result: denial(req, field.ErrorList{err})}
	}
	return nil
}
