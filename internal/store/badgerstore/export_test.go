package badgerstore

// SetAfterCommit makes f run between each batch's commit and the
// publication of its events, in stores opened from now on, until the
// returned function is called (after those stores are closed).
func SetAfterCommit(f func()) (reset func()) {
	afterCommit = f
	return func() { afterCommit = nil }
}
