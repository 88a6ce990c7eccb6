package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// residentBytes is the resident set size of process pid (0: this
// process), from /proc.
func residentBytes(pid int) (uint64, bool) {
	path := "/proc/self/statm"
	if pid != 0 {
		path = "/proc/" + strconv.Itoa(pid) + "/statm"
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	fields := strings.Fields(string(data))
	if len(fields) < 2 {
		return 0, false
	}
	pages, err := strconv.ParseUint(fields[1], 10, 64)
	if err != nil {
		return 0, false
	}
	return pages * uint64(os.Getpagesize()), true
}

// processWithArg finds the process whose command line has arg as one of
// its arguments (an etcd member by its data directory).
func processWithArg(arg string) (int, bool) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for _, a := range bytes.Split(cmdline, []byte{0}) {
			if string(a) == arg || strings.HasSuffix(string(a), "="+arg) {
				return pid, true
			}
		}
	}
	return 0, false
}

// diskBytes is the space the files under dir take on disk: allocated
// blocks, not apparent sizes (Badger preallocates and memory-maps files
// larger than what it wrote).
func diskBytes(dir string) (uint64, bool) {
	var total uint64
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			total += uint64(st.Blocks) * 512
		}
		return nil
	})
	return total, err == nil
}

// LoadAverage is the machine's one-minute load average (as uptime shows
// it), from /proc/loadavg.
func LoadAverage() (float64, bool) {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, false
	}
	fields := strings.Fields(string(data))
	if len(fields) == 0 {
		return 0, false
	}
	load, err := strconv.ParseFloat(fields[0], 64)
	return load, err == nil
}
