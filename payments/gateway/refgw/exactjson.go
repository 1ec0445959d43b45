package refgw

import (
	"bytes"
	"encoding"
	"encoding/json"
	"reflect"
	"strings"
	"sync"
)

// decodeExact decodes raw into out (a pointer) matching object keys to the json names exactly.
// encoding/json matches keys without regard to case, and the later of two matching keys wins;
// the contract lets a gateway send any unknown field ("Unknown fields must be ignored"), so an
// unknown "Status" or "AMOUNT" after "status" and "amount" would overwrite them: a pending
// payment read as succeeded, a captured 1.00 read as 50.00. Every key that is not exactly one of
// the wire type's names is dropped first, at every depth the wire types go, as unknown fields
// are; what is left is decoded as usual.
func decodeExact(raw []byte, out any) error {
	kept, err := keepExact(raw, reflect.TypeOf(out).Elem())
	if err != nil {
		return err
	}
	return json.Unmarshal(kept, out)
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// keepExact returns raw with the keys of every object that t decodes as a struct reduced to
// t's exact json names. Values of other types (and types that decode themselves) are left as
// they are.
func keepExact(raw json.RawMessage, t reflect.Type) (json.RawMessage, error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) || reflect.PointerTo(t).Implements(jsonUnmarshaler) ||
		reflect.PointerTo(t).Implements(textUnmarshaler) {
		return raw, nil
	}
	switch t.Kind() {
	case reflect.Struct:
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil, err
		}
		fields := exactFields(t)
		kept := make(map[string]json.RawMessage, len(fields))
		for k, v := range obj {
			ft, ok := fields[k]
			if !ok {
				continue
			}
			v, err := keepExact(v, ft)
			if err != nil {
				return nil, err
			}
			kept[k] = v
		}
		return json.Marshal(kept)
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return raw, nil
		}
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return nil, err
		}
		for i, it := range items {
			v, err := keepExact(it, t.Elem())
			if err != nil {
				return nil, err
			}
			items[i] = v
		}
		return json.Marshal(items)
	default:
		return raw, nil
	}
}

var fieldsCache sync.Map // reflect.Type → map[string]reflect.Type

// exactFields maps a struct's json names to their fields' types (a field without a tag goes by
// its Go name, as encoding/json does; an embedded struct is refused, see above). Maps are not
// filtered: no wire type has one.
func exactFields(t reflect.Type) map[string]reflect.Type {
	if f, ok := fieldsCache.Load(t); ok {
		return f.(map[string]reflect.Type)
	}
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous {
			// encoding/json promotes an embedded struct's fields; this filter does not, and
			// would drop them silently. No wire type embeds one (TestWireTypesDecodeExactly).
			panic("refgw: decodeExact cannot read " + t.String() + ": it embeds " + f.Type.String())
		}
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		fields[name] = f.Type
	}
	fieldsCache.Store(t, fields)
	return fields
}
