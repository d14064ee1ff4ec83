// Package legacypods is the admission path that translates pods written for
// other GPU-sharing systems (HAMi, gpushare, Koordinator, NVIDIA's device
// plugin) at Pod CREATE, with pkg/legacy's Translate, and the controller that
// creates the ResourceClaimTemplates translated pods name and removes them
// once no pod uses them.
//
// [Translator.Admit] is the mutating webhook's decision on one pod, and it
// writes nothing to the API server: the pod's legacy resources and
// annotations become references to ResourceClaimTemplates of
// gpu.tessera.dev, and the answer is a JSONPatch that makes the pod what
// Translate returned, labelled legacy.LabelTranslated and annotated with
// what was removed (legacy.AnnotationSource). A template of the same name
// that Tessera did not make, or whose spec differs, is never used: the pod
// is refused, naming it.
//
// [Controller] watches translated pods in namespaces that opted in
// (NamespaceLabel) and creates each template such a pod names that does not
// exist, rebuilt from the stored pod's own annotation; the API server's
// resourceclaim controller then creates the pod's claims. So a request that
// did not come from the API server, whatever namespace it names, creates
// nothing, and a pod gets only templates its own spec asked for. The
// Controller deletes the templates it made (legacy.LabelTranslated and
// LabelAdmission) that no pod of their namespace references once they are
// older than a grace period; `tessera convert`'s templates lack
// LabelAdmission and stay.
//
// It is its own package because pkg/legacy imports pkg/webhook (its
// templates pass webhook.ValidateDeviceClaim).
package legacypods
