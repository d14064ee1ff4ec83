// Package legacypods is the admission path that translates pods written for
// other GPU-sharing systems (HAMi, gpushare, Koordinator, NVIDIA's device
// plugin) at Pod CREATE, with pkg/legacy's Translate, and the controller that
// removes the ResourceClaimTemplates it made once no pod uses them.
//
// [Translator.Admit] is the mutating webhook's decision on one pod: the
// pod's legacy resources and annotations become references to
// ResourceClaimTemplates of gpu.tessera.dev, which it creates in the pod's
// namespace before answering (nothing on a dry run), and the answer is a
// JSONPatch that makes the pod what Translate returned. A template of the
// same name that Tessera did not make, or whose spec differs, is never used:
// the pod is refused, naming it. [Cleaner] deletes templates the webhook
// made (legacy.LabelTranslated and LabelAdmission), in namespaces that
// opted in (NamespaceLabel), that no pod of their namespace references once
// they are older than a grace period (and were not used by an admission
// since), so a template whose pod a later admission step rejected does not
// stay; `tessera convert`'s templates lack LabelAdmission and stay.
//
// It is its own package because pkg/legacy imports pkg/webhook (its
// templates pass webhook.ValidateDeviceClaim).
package legacypods
