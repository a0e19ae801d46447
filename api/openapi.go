package api

import (
	_ "embed"
)

// openAPI is the REST API's OpenAPI 3 document (api/openapi.yaml);
// TestOpenAPIListsEveryRoute holds it to the routes.
//
//go:embed openapi.yaml
var openAPI []byte

func serveOpenAPI(c *call) error {
	c.written = true
	c.w.Header().Set("Content-Type", "application/yaml")
	_, err := c.w.Write(openAPI)
	return err
}
