package legacy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// workloadTemplates is where each kind keeps its pod template, by API group
// and kind (any version: gpushare's guide still writes apps/v1beta1). A Pod
// is its own template (metadata and spec at the top).
var workloadTemplates = map[string][]string{
	"/Pod":             nil,
	"apps/Deployment":  {"spec", "template"},
	"apps/StatefulSet": {"spec", "template"},
	"apps/DaemonSet":   {"spec", "template"},
	"apps/ReplicaSet":  {"spec", "template"},
	"batch/Job":        {"spec", "template"},
	"batch/CronJob":    {"spec", "jobTemplate", "spec", "template"},
}

// ConvertManifests translates a multi-document YAML stream of manifests
// (what kubectl apply -f takes) and returns the stream to apply instead: the
// ResourceClaimTemplates first (so that they exist when the pods are
// created), once each per namespace and in the namespace of the objects that
// use them, then every document in its order. Pods, Deployments,
// StatefulSets, DaemonSets, ReplicaSets, Jobs and CronJobs are translated
// ([Translate]); a translated document is written anew (keys sorted, its
// comments lost); every other document, and one with nothing to translate,
// is passed through byte for byte. Errors name the document (1-based, with
// its kind and name) and the field; all documents' errors come together.
func ConvertManifests(data []byte, opts Options) ([]byte, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	var errs []error
	templates := map[string]resourceapi.ResourceClaimTemplate{}
	for n := 1; ; n++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		converted, tmpls, err := convertDocument(doc, opts)
		if err != nil {
			errs = append(errs, fmt.Errorf("document %d%s", n, err))
			continue
		}
		if converted == nil {
			continue // only comments or whitespace
		}
		docs = append(docs, converted)
		for _, t := range tmpls {
			templates[t.Namespace+"/"+t.Name] = t
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var out bytes.Buffer
	for _, key := range slices.Sorted(maps.Keys(templates)) {
		b, err := yaml.Marshal(templates[key])
		if err != nil {
			return nil, fmt.Errorf("encode ResourceClaimTemplate %s: %w", key, err)
		}
		out.WriteString("---\n")
		out.Write(b)
	}
	for _, d := range docs {
		if !bytes.HasPrefix(d, []byte("---")) {
			out.WriteString("---\n")
		}
		out.Write(d)
		if !bytes.HasSuffix(d, []byte("\n")) {
			out.WriteString("\n")
		}
	}
	return out.Bytes(), nil
}

// convertDocument translates one document; nil when it holds no object.
// Errors start with " (Kind namespace/name): ".
func convertDocument(doc []byte, opts Options) ([]byte, []resourceapi.ResourceClaimTemplate, error) {
	var obj map[string]any
	if err := yaml.Unmarshal(doc, &obj); err != nil {
		return nil, nil, fmt.Errorf(": not YAML: %w", err)
	}
	if len(obj) == 0 {
		return nil, nil, nil
	}
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	meta, _ := obj["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	namespace, _ := meta["namespace"].(string)
	what := fmt.Sprintf(" (%s %s)", kind, name)
	if namespace != "" {
		what = fmt.Sprintf(" (%s %s/%s)", kind, namespace, name)
	}
	group, _, _ := strings.Cut(apiVersion, "/")
	if !strings.Contains(apiVersion, "/") {
		group = ""
	}
	if group == "" && kind == "List" {
		return nil, nil, fmt.Errorf("%s: a List: write its items as documents of their own to convert them", what)
	}
	path, ok := workloadTemplates[group+"/"+kind]
	if !ok {
		return doc, nil, nil
	}
	var tmplMap map[string]any
	var root *field.Path
	if path == nil {
		tmplMap = map[string]any{"metadata": obj["metadata"], "spec": obj["spec"]}
	} else {
		root = field.NewPath(path[0], path[1:]...)
		tmplMap, _ = nested(obj, path)
		if tmplMap == nil {
			return doc, nil, nil
		}
	}
	raw, err := json.Marshal(tmplMap)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	var tmpl corev1.PodTemplateSpec
	if err := yaml.UnmarshalStrict(raw, &tmpl); err != nil {
		// Strict: a field this version does not know would be lost when the
		// template is written anew.
		return nil, nil, fmt.Errorf("%s: %s: %w", what, root.String(), err)
	}
	result, ferrs := Translate(&tmpl, root, opts)
	if len(ferrs) > 0 {
		msgs := make([]string, len(ferrs))
		for i, e := range ferrs {
			msgs[i] = e.Error()
		}
		return nil, nil, fmt.Errorf("%s: %s", what, strings.Join(msgs, "; "))
	}
	if !result.Changed {
		return doc, nil, nil
	}
	raw, err = json.Marshal(result.Template)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	var newTmpl map[string]any
	if err := json.Unmarshal(raw, &newTmpl); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	if m, ok := newTmpl["metadata"].(map[string]any); ok {
		if ts, ok := m["creationTimestamp"]; ok && ts == nil {
			delete(m, "creationTimestamp")
		}
	}
	if path == nil {
		obj["metadata"], obj["spec"] = newTmpl["metadata"], newTmpl["spec"]
	} else {
		parent, _ := nested(obj, path[:len(path)-1])
		parent[path[len(path)-1]] = newTmpl
	}
	out, err := yaml.Marshal(obj)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	for i := range result.ClaimTemplates {
		result.ClaimTemplates[i].Namespace = namespace
	}
	return out, result.ClaimTemplates, nil
}

// nested is the map at path in obj, or nil.
func nested(obj map[string]any, path []string) (map[string]any, bool) {
	cur := obj
	for _, p := range path {
		next, ok := cur[p].(map[string]any)
		if !ok {
			return nil, false
		}
		cur = next
	}
	return cur, true
}
