// Package populated finds the fields of a value left at their zero value,
// for the tests that need a fully populated value: a compatibility test
// between a domain type and its tether.v1 message proves nothing about a
// field it leaves empty, and a field added later without a value in the
// test would pass unseen.
package populated

import (
	"fmt"
	"reflect"
	"sort"
	"time"
)

// Unset returns the paths of every field of v (recursively, through
// pointers, slice elements and map values) that holds its zero value, or
// an empty slice, map or nil pointer. A time.Time is one value.
func Unset(v any) []string {
	var out []string
	walk(reflect.ValueOf(v), "", &out)
	return out
}

var timeType = reflect.TypeFor[time.Time]()

func walk(v reflect.Value, path string, out *[]string) {
	if !v.IsValid() || v.IsZero() {
		*out = append(*out, path)
		return
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		walk(v.Elem(), path, out)
	case reflect.Struct:
		if v.Type() == timeType {
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				walk(v.Field(i), join(path, v.Type().Field(i).Name), out)
			}
		}
	case reflect.Slice:
		if v.Len() == 0 {
			*out = append(*out, path)
		}
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return
		}
		for i := range v.Len() {
			walk(v.Index(i), fmt.Sprintf("%s[%d]", path, i), out)
		}
	case reflect.Map:
		if v.Len() == 0 {
			*out = append(*out, path)
		}
		keys := v.MapKeys()
		sort.Slice(keys, func(i, j int) bool { return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j]) })
		for _, k := range keys {
			walk(v.MapIndex(k), fmt.Sprintf("%s[%v]", path, k), out)
		}
	}
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
