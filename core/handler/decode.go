package handler

import (
	"errors"
	"fmt"

	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// DecodeStrict decodes YAML or JSON into v as the API server does for a strict request: a
// field v does not have, a field spelt in another case, or a field given twice is an error.
func DecodeStrict(data []byte, v any) error {
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, v)
	if err != nil {
		return err
	}
	if len(strict) > 0 {
		return fmt.Errorf("strict decoding: %w", errors.Join(strict...))
	}
	return nil
}
