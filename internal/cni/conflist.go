package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
)

// ErrNotUnderstood is returned for a CNI configuration file the installer
// does not understand; such a file is never modified.
var ErrNotUnderstood = errors.New("CNI configuration not understood")

// maxConfBytes bounds a CNI configuration file the installer reads.
const maxConfBytes = 1 << 20

// maxJSONDepth bounds the nesting of a configuration file.
const maxJSONDepth = 64

// member is one key of a JSON object, in document order.
type member struct {
	key string
	val json.RawMessage
}

// confList is a parsed network configuration list; a single network
// configuration (.conf) is held as the list of its one plugin, as libcni
// would run it.
type confList struct {
	top     []member          // the list's keys in order, "plugins" included
	plugins []json.RawMessage // the "plugins" value
	single  bool              // parsed from a single configuration
}

func notUnderstood(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrNotUnderstood, fmt.Sprintf(format, a...))
}

// parseConf parses a CNI configuration file (a list if it has "plugins",
// else a single configuration) and checks what the plugin needs to chain
// into it: strict JSON without duplicate keys, a name, plugins that each
// have a type, and a CNI version the plugin speaks.
func parseConf(data []byte) (*confList, error) {
	if len(data) > maxConfBytes {
		return nil, notUnderstood("larger than %d bytes", maxConfBytes)
	}
	if err := checkJSON(data, 0); err != nil {
		return nil, notUnderstood("%v", err)
	}
	top, err := decodeObject(data)
	if err != nil {
		return nil, notUnderstood("%v", err)
	}
	get := func(k string) (json.RawMessage, bool) {
		i := slices.IndexFunc(top, func(m member) bool { return m.key == k })
		if i < 0 {
			return nil, false
		}
		return top[i].val, true
	}
	str := func(k string) (string, error) {
		raw, ok := get(k)
		if !ok {
			return "", nil
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", notUnderstood("%q is not a string", k)
		}
		return s, nil
	}
	name, err := str("name")
	if err != nil {
		return nil, err
	}
	if name == "" {
		return nil, notUnderstood(`no "name"`)
	}
	ver, err := str("cniVersion")
	if err != nil {
		return nil, err
	}
	if !slices.Contains(SupportedVersions, ver) {
		return nil, notUnderstood("cniVersion %q: %s chains into versions %v", ver, PluginType, SupportedVersions)
	}
	c := &confList{}
	rawPlugins, isList := get("plugins")
	if !isList {
		// A single configuration: it becomes the first plugin of a list
		// with its name and version, as Istio's installer converts one.
		if _, err := pluginType(data); err != nil {
			return nil, err
		}
		c.single = true
		c.plugins = []json.RawMessage{slices.Clone(data)}
		vb, _ := json.Marshal(ver)
		nb, _ := json.Marshal(name)
		c.top = []member{{"cniVersion", vb}, {"name", nb}, {"plugins", nil}}
		return c, nil
	}
	if raw, ok := get("cniVersions"); ok {
		var vs []string
		if err := json.Unmarshal(raw, &vs); err != nil {
			return nil, notUnderstood(`"cniVersions" is not a list of strings`)
		}
		for _, v := range vs {
			if !slices.Contains(SupportedVersions, v) {
				return nil, notUnderstood("cniVersions has %q: %s chains into versions %v", v, PluginType, SupportedVersions)
			}
		}
	}
	if err := json.Unmarshal(rawPlugins, &c.plugins); err != nil || len(c.plugins) == 0 {
		return nil, notUnderstood(`"plugins" is not a non-empty list`)
	}
	for i, p := range c.plugins {
		if _, err := pluginType(p); err != nil {
			return nil, fmt.Errorf("plugin %d: %w", i, err)
		}
	}
	c.top = top
	return c, nil
}

// pluginType returns a plugin configuration's non-empty "type".
func pluginType(raw json.RawMessage) (string, error) {
	var p map[string]json.RawMessage
	if err := json.Unmarshal(raw, &p); err != nil {
		return "", notUnderstood("a plugin is not an object")
	}
	var t string
	if err := json.Unmarshal(p["type"], &t); err != nil || t == "" {
		return "", notUnderstood(`a plugin has no "type"`)
	}
	return t, nil
}

// ours reports the indices of the plugin's entries.
func (c *confList) ours() []int {
	var idx []int
	for i, p := range c.plugins {
		if t, _ := pluginType(p); t == PluginType {
			idx = append(idx, i)
		}
	}
	return idx
}

// withEntry returns the list with entry as the plugin's one entry: it
// replaces the first existing entry, or is appended. changed is false when
// the list already held exactly that.
func (c *confList) withEntry(entry json.RawMessage) (out *confList, changed bool) {
	idx := c.ours()
	if len(idx) == 1 && bytes.Equal(compact(c.plugins[idx[0]]), compact(entry)) {
		return c, false
	}
	n := *c
	n.plugins = nil
	placed := false
	for i, p := range c.plugins {
		switch {
		case !slices.Contains(idx, i):
			n.plugins = append(n.plugins, p)
		case !placed:
			n.plugins = append(n.plugins, entry)
			placed = true
		}
	}
	if !placed {
		n.plugins = append(n.plugins, entry)
	}
	return &n, true
}

// withoutEntry returns the list without the plugin's entries.
func (c *confList) withoutEntry() *confList {
	n := *c
	n.plugins = slices.DeleteFunc(slices.Clone(c.plugins), func(p json.RawMessage) bool {
		t, _ := pluginType(p)
		return t == PluginType
	})
	return &n
}

// marshal renders the list as an indented conflist, keys in their
// original order.
func (c *confList) marshal() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range c.top {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(m.key)
		b.Write(k)
		b.WriteByte(':')
		if m.key == "plugins" {
			b.WriteByte('[')
			for j, p := range c.plugins {
				if j > 0 {
					b.WriteByte(',')
				}
				b.Write(p)
			}
			b.WriteByte(']')
			continue
		}
		b.Write(m.val)
	}
	b.WriteByte('}')
	var out bytes.Buffer
	if err := json.Indent(&out, b.Bytes(), "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

func compact(raw []byte) []byte {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return raw
	}
	return b.Bytes()
}

// decodeObject returns a JSON object's members in document order.
func decodeObject(data []byte) ([]member, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	var ms []member
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return nil, err
		}
		k, _ := tok.(string)
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return nil, err
		}
		ms = append(ms, member{k, v})
	}
	return ms, nil
}

// checkJSON checks that data is one JSON value, nested at most
// maxJSONDepth deep, whose objects have no duplicate keys (which decoders
// resolve differently).
func checkJSON(data []byte, depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("nested deeper than %d", maxJSONDepth)
	}
	d := json.NewDecoder(bytes.NewReader(data))
	tok, err := d.Token()
	if err != nil {
		return fmt.Errorf("invalid JSON: %w", err)
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for d.More() {
			tok, err := d.Token()
			if err != nil {
				return fmt.Errorf("invalid JSON: %w", err)
			}
			k, _ := tok.(string)
			if seen[k] {
				return fmt.Errorf("duplicate key %q", k)
			}
			seen[k] = true
			var v json.RawMessage
			if err := d.Decode(&v); err != nil {
				return fmt.Errorf("invalid JSON: %w", err)
			}
			if err := checkJSON(v, depth+1); err != nil {
				return err
			}
		}
	case json.Delim('['):
		for d.More() {
			var v json.RawMessage
			if err := d.Decode(&v); err != nil {
				return fmt.Errorf("invalid JSON: %w", err)
			}
			if err := checkJSON(v, depth+1); err != nil {
				return err
			}
		}
	}
	if _, isDelim := tok.(json.Delim); isDelim {
		if _, err := d.Token(); err != nil { // the closing delimiter
			return fmt.Errorf("invalid JSON: %w", err)
		}
	}
	if _, err := d.Token(); err != io.EOF {
		return errors.New("invalid JSON: data after the value")
	}
	return nil
}
