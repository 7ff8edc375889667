// Package cloudinit holds the rules on cloud-init user data that admission and the node handler
// share: what user data SSH keys can be added to, how they are added, and how keys are read
// from an access credential's Secret.
package cloudinit

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// CloudConfigHeader is the first line of user data that cloud-init reads as cloud-config.
const CloudConfigHeader = "#cloud-config"

// AuthorizedKeysKey is the cloud-config key of the default user's SSH public keys.
const AuthorizedKeysKey = "ssh_authorized_keys"

// ErrNotCloudConfig is returned for user data that SSH keys cannot be added to: a script, a
// MIME multi-part archive, or anything else that is not cloud-config.
var ErrNotCloudConfig = errors.New("user data is not cloud-config (it does not start with " + CloudConfigHeader +
	"), so SSH keys cannot be added to it: put them into its ssh_authorized_keys, or make it cloud-config")

// IsCloudConfig says whether user data is cloud-config: its first line is #cloud-config
// (trailing blanks allowed), as cloud-init decides. Empty user data is not.
func IsCloudConfig(userData []byte) bool {
	first, _, _ := bytes.Cut(userData, []byte("\n"))
	return strings.TrimRight(string(first), " \t\r") == CloudConfigHeader
}

// CanAddKeys says whether AddAuthorizedKeys can add keys to userData, and if not why: the user
// data is empty or a cloud-config whose ssh_authorized_keys, if present, is a list.
func CanAddKeys(userData []byte) error {
	_, err := AddAuthorizedKeys(userData, nil)
	return err
}

// AddAuthorizedKeys returns userData with keys appended to its ssh_authorized_keys list (made
// when missing); keys already in the list are not added twice. Empty user data becomes a
// cloud-config of the keys alone. User data that is not cloud-config is refused with
// ErrNotCloudConfig, and a cloud-config that is not a YAML mapping, or whose
// ssh_authorized_keys is not a list, with an error saying so. The rest of the document (its
// other keys, their order, comments) is kept; the output is re-indented.
func AddAuthorizedKeys(userData []byte, keys []string) ([]byte, error) {
	if len(bytes.TrimSpace(userData)) == 0 {
		userData = []byte(CloudConfigHeader + "\n")
	}
	if !IsCloudConfig(userData) {
		return nil, ErrNotCloudConfig
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(userData, &doc); err != nil {
		return nil, fmt.Errorf("user data: cloud-config is not valid YAML: %w", err)
	}
	if doc.Kind == 0 { // only the header comment
		doc = yaml.Node{Kind: yaml.DocumentNode, HeadComment: CloudConfigHeader, Content: []*yaml.Node{{Kind: yaml.MappingNode, Tag: "!!map"}}}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("user data: cloud-config is not a YAML mapping")
	}
	root := doc.Content[0]
	var list *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == AuthorizedKeysKey {
			list = root.Content[i+1]
			if list.Kind == yaml.ScalarNode && list.Tag == "!!null" {
				*list = yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
			}
			if list.Kind != yaml.SequenceNode {
				return nil, fmt.Errorf("user data: cloud-config's %s is not a list", AuthorizedKeysKey)
			}
		}
	}
	if list == nil {
		list = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: AuthorizedKeysKey}, list)
	}
	// A block list, one key a line, whatever style the user wrote: simple readers (the test
	// guest's) take only that form.
	list.Style &^= yaml.FlowStyle
	have := map[string]bool{}
	for _, n := range list.Content {
		have[n.Value] = true
	}
	for _, k := range keys {
		if !have[k] {
			have[k] = true
			list.Content = append(list.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k})
		}
	}
	// The header is a comment, which the YAML library keeps as the document's head comment or
	// its first key's; it must stay the first line, and is written as the first key's, which
	// the library puts right above the key (a document's comes with a blank line after it).
	if doc.HeadComment != "" && len(root.Content) > 0 {
		c := doc.HeadComment
		if root.Content[0].HeadComment != "" {
			c += "\n\n" + root.Content[0].HeadComment
		}
		doc.HeadComment, root.Content[0].HeadComment = "", c
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("user data: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("user data: %w", err)
	}
	b := out.Bytes()
	if !IsCloudConfig(b) {
		b = append([]byte(CloudConfigHeader+"\n"), b...)
	}
	return b, nil
}

// KeysOf returns the SSH public keys in the data of an access credential's Secret, as KubeVirt
// reads them: every value, in key order, holds keys one a line; blank lines and lines starting
// with # are skipped.
func KeysOf(data map[string][]byte) []string {
	var keys []string
	for _, name := range slices.Sorted(maps.Keys(data)) {
		for line := range strings.SplitSeq(string(data[name]), "\n") {
			line = strings.TrimSpace(line)
			if line != "" && !strings.HasPrefix(line, "#") {
				keys = append(keys, line)
			}
		}
	}
	return keys
}
