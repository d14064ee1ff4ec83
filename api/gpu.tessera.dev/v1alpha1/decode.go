package v1alpha1

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	jsonserializer "k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// MaxConfigBytes is the largest input the decoders accept. The API server caps
// opaque parameters at 10 KiB; the larger bound leaves room for commented YAML
// files given to the CLI while keeping the parser's work small.
const MaxConfigBytes = 64 * 1024

var (
	scheme = runtime.NewScheme()

	// The serializers below are apimachinery's JSON/YAML serializer. They are
	// stateless and safe for concurrent use.
	strictJSON  = newSerializer(false, true)
	strictYAML  = newSerializer(true, true)
	lenientJSON = newSerializer(false, false)
	lenientYAML = newSerializer(true, false)
)

func init() {
	utilruntime.Must(AddToScheme(scheme))
}

func newSerializer(yaml, strict bool) *jsonserializer.Serializer {
	return jsonserializer.NewSerializerWithOptions(typeMetaChecker{}, scheme, scheme,
		jsonserializer.SerializerOptions{Yaml: yaml, Strict: strict})
}

// DecodeStrict decodes a GpuConfig written by a user: the opaque parameters of a
// claim or class, an object under admission review, a file given to the CLI.
//
// raw is JSON or YAML (one document, at most MaxConfigBytes). apiVersion must be
// gpu.tessera.dev/v1alpha1 and kind GpuConfig. Unknown fields, fields spelled in
// another case and duplicate fields are errors; each problem names its field path
// (for example "sharing.isolaton: unknown field"), and all of them are reported
// at once.
//
// DecodeStrict only decodes: it neither defaults nor validates values, so that a
// webhook can report the config as written. Call Validate (and Default) next, or
// use ConfigForRequest, which does all of it. A non-nil error is a sentence meant
// for the user and starts with "invalid GpuConfig: ". It never panics on input.
func DecodeStrict(raw []byte) (*GpuConfig, error) {
	return decode(raw, strictJSON, strictYAML)
}

// DecodeLenient decodes a GpuConfig that this or another version of the driver
// wrote, such as a checkpoint: unknown and duplicate fields are ignored (the last
// duplicate wins), so configs written by a newer plugin that added fields still
// load. apiVersion and kind are still checked, and field values must still have
// the right type. Like DecodeStrict it neither defaults nor validates.
func DecodeLenient(raw []byte) (*GpuConfig, error) {
	return decode(raw, lenientJSON, lenientYAML)
}

func decode(raw []byte, jsonSerializer, yamlSerializer runtime.Decoder) (*GpuConfig, error) {
	if err := checkInput(raw); err != nil {
		return nil, invalid(err.Error())
	}
	// Valid JSON goes to the JSON serializer, whose strict errors carry full
	// field paths; everything else is YAML (a superset of JSON, but the YAML
	// parser reports duplicate keys by line rather than by path).
	serializer, js := yamlSerializer, raw
	if utilyaml.IsJSONBuffer(raw) && json.Valid(raw) {
		serializer = jsonSerializer
	} else if converted, err := yaml.YAMLToJSON(raw); err == nil {
		js = converted
	}
	if err := checkQuantityExponents(js); err != nil {
		return nil, invalid(err.Error())
	}
	obj, _, err := serializer.Decode(raw, nil, nil)
	if err != nil {
		return nil, invalid(describeDecodeError(err)...)
	}
	cfg, ok := obj.(*GpuConfig)
	if !ok {
		// Unreachable: typeMetaChecker admits only GpuConfig.
		return nil, invalid(fmt.Sprintf("decoded %T instead of a GpuConfig", obj))
	}
	return cfg, nil
}

// checkInput rejects input the serializer would misread rather than reject: empty
// input, and YAML with several documents (the serializer reads only the first).
func checkInput(raw []byte) error {
	if len(raw) > MaxConfigBytes {
		return fmt.Errorf("the input is %d bytes, more than the %d accepted", len(raw), MaxConfigBytes)
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	documents := 0
	for {
		doc, err := reader.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			// Let the parser report it with a line number.
			return nil
		}
		if len(bytes.TrimSpace(stripYAMLComments(doc))) > 0 {
			documents++
		}
	}
	if documents == 0 {
		return errors.New("the input is empty; expected an object with apiVersion " +
			SchemeGroupVersion.String() + " and kind " + GpuConfigKind)
	}
	if documents > 1 {
		return fmt.Errorf("the input holds %d YAML documents; exactly one GpuConfig is accepted", documents)
	}
	return nil
}

// stripYAMLComments drops lines that hold only a comment, so that a document that
// is nothing but comments is not counted as a document.
func stripYAMLComments(doc []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		trimmed := bytes.TrimSpace(line)
		if len(trimmed) == 0 || trimmed[0] == '#' || bytes.Equal(trimmed, []byte("---")) {
			continue
		}
		out = append(out, line...)
		out = append(out, '\n')
	}
	return out
}

// invalid builds the error DecodeStrict and DecodeLenient return.
func invalid(problems ...string) error {
	return errors.New("invalid GpuConfig: " + strings.Join(problems, "; "))
}

// typeMetaChecker is the serializer's MetaFactory. It reads apiVersion and kind
// like jsonserializer.DefaultMetaFactory, and rejects everything but
// gpu.tessera.dev/v1alpha1 GpuConfig with a message that says what was found and
// what is supported, before the serializer would report a scheme lookup failure.
type typeMetaChecker struct{}

func (typeMetaChecker) Interpret(data []byte) (*schema.GroupVersionKind, error) {
	var typeMeta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := json.Unmarshal(data, &typeMeta); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			if typeErr.Field == "" {
				return nil, fmt.Errorf("must be an object with apiVersion and kind, not %s", article(typeErr.Value))
			}
			return nil, fmt.Errorf("%s: must be a string, not %s", typeErr.Field, article(typeErr.Value))
		}
		return nil, fmt.Errorf("not valid JSON: %v", err)
	}
	var problems []string
	for _, f := range []struct{ name, value, supported string }{
		{"apiVersion", typeMeta.APIVersion, SchemeGroupVersion.String()},
		{"kind", typeMeta.Kind, GpuConfigKind},
	} {
		switch f.value {
		case f.supported:
		case "":
			problems = append(problems, fmt.Sprintf("%s is missing (supported: %s)", f.name, f.supported))
		default:
			problems = append(problems, fmt.Sprintf("%s %q is not supported (supported: %s)", f.name, f.value, f.supported))
		}
	}
	if len(problems) > 0 {
		return nil, typeMetaError(problems)
	}
	gvk := SchemeGroupVersion.WithKind(GpuConfigKind)
	return &gvk, nil
}

// typeMetaError lists what is wrong with apiVersion and kind.
type typeMetaError []string

func (e typeMetaError) Error() string { return strings.Join(e, "; ") }

// yamlDuplicateKey matches the YAML parser's report of a duplicate mapping key.
var yamlDuplicateKey = regexp.MustCompile(`line (\d+): key (".*") already set in map`)

// describeDecodeError turns what the serializer returned into user-facing
// problems, one per entry.
func describeDecodeError(err error) []string {
	var problems []string
	if strictErr, ok := runtime.AsStrictDecodingError(err); ok {
		for _, e := range strictErr.Errors() {
			problems = append(problems, describeStrictError(e)...)
		}
		return problems
	}
	var typeMetaErr typeMetaError
	if errors.As(err, &typeMetaErr) {
		return typeMetaErr
	}
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return []string{describeTypeError(typeErr)}
	}
	if errors.Is(err, resource.ErrFormatWrong) || errors.Is(err, resource.ErrNumeric) || errors.Is(err, resource.ErrSuffix) {
		// resource.Quantity reports parse errors without a field path;
		// memoryLimit is the only Quantity in GpuConfig.
		return []string{"sharing.memoryLimit: must be a quantity such as 16Gi or 512Mi"}
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "error converting YAML to JSON: ") || strings.HasPrefix(msg, "yaml: ") {
		msg = strings.TrimPrefix(msg, "error converting YAML to JSON: ")
		msg = strings.TrimPrefix(msg, "yaml: ")
		return []string{"not valid JSON or YAML: " + oneLine(msg)}
	}
	return []string{oneLine(msg)}
}

// describeStrictError renders one strict-decoding failure. Errors from the JSON
// decoder carry a field path; errors from the YAML parser (duplicate keys in YAML
// input) carry a line number.
func describeStrictError(err error) []string {
	var pathErr interface{ FieldPath() string }
	if errors.As(err, &pathErr) {
		problem := "unknown field"
		if strings.HasPrefix(err.Error(), "duplicate field") {
			problem = "duplicate field"
		}
		return []string{quotedKey(pathErr.FieldPath()) + ": " + problem}
	}
	matches := yamlDuplicateKey.FindAllStringSubmatch(err.Error(), -1)
	if len(matches) == 0 {
		return []string{oneLine(strings.TrimPrefix(err.Error(), "error converting YAML to JSON: "))}
	}
	problems := make([]string, 0, len(matches))
	for _, m := range matches {
		problems = append(problems, fmt.Sprintf("line %s: duplicate field %s", m[1], m[2]))
	}
	return problems
}

func describeTypeError(err *json.UnmarshalTypeError) string {
	field := err.Field
	if field == "" {
		field = "GpuConfig"
	}
	return fmt.Sprintf("%s: must be %s, not %s", field, describeType(err.Type), article(err.Value))
}

// describeType names a Go type the way a YAML author thinks of it.
func describeType(t reflect.Type) string {
	if t == nil {
		return "a different type"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Int,
		reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uint:
		return fmt.Sprintf("an integer that fits in %d bits", t.Bits())
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Struct, reflect.Map:
		return "an object"
	default:
		return "a " + t.String()
	}
}

// article prefixes what encoding/json calls a JSON value ("string", "number 1.5",
// "object") with an article.
func article(value string) string {
	if value == "" {
		return "this value"
	}
	if strings.HasPrefix(value, "number ") {
		return "the " + value
	}
	switch value[0] {
	case 'a', 'e', 'i', 'o', 'u':
		return "an " + value
	}
	return "a " + value
}

// quotedKey is a field path built from the input's keys as messages show it:
// as is when every character is printable and needs no escape, else Go-quoted
// (control characters, quotes and newlines in a key the user wrote must not
// reach events and logs raw).
func quotedKey(path string) string {
	if q := strconv.Quote(path); q[1:len(q)-1] != path {
		return q
	}
	return path
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
