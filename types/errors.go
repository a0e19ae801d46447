package types

import "errors"

// Errors of the managers' backing-image transfers (upload, copy), shared so
// the REST API maps them to status codes without importing the controllers.
var (
	ErrImageNotFound = errors.New("not found")
	ErrImageConflict = errors.New("conflict")
	ErrImageNotReady = errors.New("not ready")
	ErrImageTooLarge = errors.New("too large")
)
