package admission

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	"k8s.io/apimachinery/pkg/runtime"
)

// createPatch is the JSON patch (RFC 6902) that turns original into mutated.
// Both sides are marshalled from the same Go types, so the diff holds only
// what the mutator changed, never artefacts of re-encoding (a
// creationTimestamp: null, an empty status) that the raw request lacks.
//
// The patch is applied to the raw object the API server sent, which may omit
// a field the Go type always encodes (an attachment ticket without
// "generation"). A "replace" of an object member is therefore sent as "add",
// which RFC 6902 defines to replace a member that exists and to create one
// that does not; array elements keep "replace".
func createPatch(original []byte, mutated runtime.Object) ([]jsonpatch.Operation, error) {
	after, err := json.Marshal(mutated)
	if err != nil {
		return nil, fmt.Errorf("encoding the mutated object: %w", err)
	}
	ops, err := jsonpatch.CreatePatch(original, after)
	if err != nil {
		return nil, fmt.Errorf("computing the JSON patch: %w", err)
	}
	for i := range ops {
		if ops[i].Operation == "replace" && !isArrayIndex(lastSegment(ops[i].Path)) {
			ops[i].Operation = "add"
		}
	}
	return ops, nil
}

func lastSegment(path string) string {
	return path[strings.LastIndexByte(path, '/')+1:]
}

// isArrayIndex tells a JSON pointer token that addresses an array element,
// where "add" would insert instead of replacing. A map key made of digits
// looks the same and keeps "replace", which is safe: map entries, unlike
// struct fields, are decoded only from what the raw object holds.
func isArrayIndex(token string) bool {
	_, err := strconv.ParseUint(token, 10, 64)
	return err == nil
}
