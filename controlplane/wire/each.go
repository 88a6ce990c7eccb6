package wire

// each is convert of every element of xs, in order; none is nil (an absent
// repeated field).
func each[T, M any](xs []T, convert func(T) M) []M {
	if len(xs) == 0 {
		return nil
	}
	out := make([]M, len(xs))
	for i, x := range xs {
		out[i] = convert(x)
	}
	return out
}

// eachOf is convert of a pointer to every element of xs, in order (the
// entries a message holds by value); none is nil.
func eachOf[T, M any](xs []T, convert func(*T) M) []M {
	if len(xs) == 0 {
		return nil
	}
	out := make([]M, len(xs))
	for i := range xs {
		out[i] = convert(&xs[i])
	}
	return out
}
