// Package accessreview builds the SubjectAccessReview that asks the API
// server whether a user may do something, for the REST API (users it
// authenticated itself) and the admission webhooks (users the API server
// names in the request) alike.
package accessreview

import authorizationv1 "k8s.io/api/authorization/v1"

// For is a review of spec as the user named by name, uid, groups and extra,
// all copied in: an authorizer may decide on any of them. E covers both
// spellings of extra, []string (user.Info) and authenticationv1.ExtraValue.
func For[E ~[]string](name, uid string, groups []string, extra map[string]E,
	spec authorizationv1.SubjectAccessReviewSpec) *authorizationv1.SubjectAccessReview {
	spec.User, spec.UID, spec.Groups = name, uid, groups
	if len(extra) > 0 {
		spec.Extra = make(map[string]authorizationv1.ExtraValue, len(extra))
		for k, v := range extra {
			spec.Extra[k] = authorizationv1.ExtraValue(v)
		}
	}
	return &authorizationv1.SubjectAccessReview{Spec: spec}
}
