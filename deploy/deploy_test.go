package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tetherhq/tether/controlplane/testserver"
)

// The server's contract the artefacts must match.
const (
	defaultPort = 7420
	healthPath  = "/healthz"
)

// k8s is the subset of Kubernetes objects the checks read.
type k8s struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		// StatefulSet
		ServiceName string `yaml:"serviceName"`
		Replicas    *int   `yaml:"replicas"`
		Selector    struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				SecurityContext struct {
					RunAsNonRoot *bool `yaml:"runAsNonRoot"`
					RunAsUser    *int  `yaml:"runAsUser"`
				} `yaml:"securityContext"`
				Containers []container `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
		VolumeClaimTemplates []struct {
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
		} `yaml:"volumeClaimTemplates"`
		// Service (its selector is a plain map; see serviceSelector)
		ClusterIP string `yaml:"clusterIP"`
		Ports     []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort any    `yaml:"targetPort"`
		} `yaml:"ports"`
		// PodDisruptionBudget
		MaxUnavailable any `yaml:"maxUnavailable"`
		MinAvailable   any `yaml:"minAvailable"`
	} `yaml:"spec"`
	raw map[string]any
}

type container struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	EnvFrom []struct {
		ConfigMapRef struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
	} `yaml:"envFrom"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	StartupProbe   *probe `yaml:"startupProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	VolumeMounts   []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
	} `yaml:"securityContext"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
}

// loadBase reads the kustomize base: every resource its kustomization
// lists, and nothing it does not.
func loadBase(t *testing.T) (map[string]k8s, []string) {
	t.Helper()
	dir := filepath.Join("kubernetes", "base")
	var kust struct {
		Resources []string `yaml:"resources"`
		Labels    []struct {
			Pairs            map[string]string `yaml:"pairs"`
			IncludeSelectors bool              `yaml:"includeSelectors"`
		} `yaml:"labels"`
		Images []struct {
			Name string `yaml:"name"`
		} `yaml:"images"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &kust); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	var listed []string
	for _, f := range files {
		if base := filepath.Base(f); base != "kustomization.yaml" {
			listed = append(listed, base)
		}
	}
	resources := slices.Clone(kust.Resources)
	slices.Sort(resources)
	if !slices.Equal(resources, listed) {
		t.Fatalf("kustomization resources %v, files %v: every manifest must be listed", resources, listed)
	}
	objs := map[string]k8s{}
	for _, r := range kust.Resources {
		b, err := os.ReadFile(filepath.Join(dir, r))
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var raw map[string]any
			err := dec.Decode(&raw)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", r, err)
			}
			if raw == nil {
				continue
			}
			again, _ := yaml.Marshal(raw)
			var o k8s
			if err := yaml.Unmarshal(again, &o); err != nil {
				t.Fatalf("%s: %v", r, err)
			}
			o.raw = raw
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Fatalf("%s: an object without apiVersion, kind or name", r)
			}
			objs[o.Kind+"/"+o.Metadata.Name] = o
		}
	}
	var images []string
	for _, im := range kust.Images {
		images = append(images, im.Name)
	}
	// Labels with includeSelectors land on selectors and pod templates
	// alike; check that they would not break what the manifests select.
	for _, l := range kust.Labels {
		if !l.IncludeSelectors {
			t.Fatal("kustomization labels must include selectors, or pods and selectors disagree")
		}
	}
	return objs, images
}

// serveFlags runs `tether <args> --help` on the real binary and returns
// the long flag names it accepts (the command's and the global ones).
func serveFlags(t *testing.T, bin string, args ...string) map[string]bool {
	t.Helper()
	out, err := exec.Command(bin, append(args, "--help")...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v --help: %v\n%s", bin, args, err, out)
	}
	flags := map[string]bool{}
	re := regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9-]+)`)
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			flags[m[1]] = true
		}
	}
	if !flags["listen"] || !flags["data-dir"] {
		t.Fatalf("could not read the flags of %v from its help:\n%s", args, out)
	}
	return flags
}

// parseArgs splits "--k=v" and "--k v" into a map; it fails on a flag the
// binary does not have.
func parseArgs(t *testing.T, where string, args []string, known map[string]bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") {
			t.Fatalf("%s: unexpected argument %q", where, a)
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !known[name] {
			t.Fatalf("%s: --%s is not a flag of `tether serve`", where, name)
		}
		if !hasValue {
			if i+1 >= len(args) {
				t.Fatalf("%s: --%s has no value", where, name)
			}
			i++
			value = args[i]
		}
		out[name] = value
	}
	return out
}

var varRef = regexp.MustCompile(`\$\(([A-Z0-9_]+)\)|\$\{([A-Z0-9_]+)\}`)

// expand resolves $(VAR) (Kubernetes) and ${VAR} (systemd) from env and
// fails on a reference env does not define.
func expand(t *testing.T, where string, args []string, env map[string]string) []string {
	t.Helper()
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = varRef.ReplaceAllStringFunc(a, func(ref string) string {
			m := varRef.FindStringSubmatch(ref)
			name := m[1] + m[2]
			v, ok := env[name]
			if !ok {
				t.Fatalf("%s: %s is not defined", where, ref)
			}
			return v
		})
	}
	return out
}

func portOf(t *testing.T, where, listen string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(listen)
	if err != nil {
		t.Fatalf("%s: --listen %q: %v", where, listen, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("%s: --listen %q: %v", where, listen, err)
	}
	return n
}

// runServe starts the real binary with flags (listen and data dir moved to
// the test's), waits for the probe path to answer 200, and stops it.
func runServe(t *testing.T, bin string, flags map[string]string, path string) {
	t.Helper()
	// The server refuses plaintext on a reachable address unless told:
	// an artefact listening so must serve TLS or say --insecure-plaintext.
	if host, _, _ := net.SplitHostPort(flags["listen"]); !isLoopback(host) && flags["tls-cert"] == "" && flags["insecure-plaintext"] != "true" {
		t.Fatalf("--listen %s is reachable from other machines: the artefact needs --tls-cert/--tls-key or --insecure-plaintext=true", flags["listen"])
	}
	// Below the kernel's ephemeral range: a port from a listen on port 0,
	// once released, is the kernel's to hand to any other test's listener
	// or outgoing connection before the binary binds it.
	addr := testserver.FreeAddr(t)
	args := []string{"serve"}
	for k, v := range flags {
		switch k {
		case "listen":
			v = addr
		case "data-dir":
			v = t.TempDir()
		}
		args = append(args, "--"+k+"="+v)
	}
	cmd := exec.Command(bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	hc := &http.Client{Timeout: 2 * time.Second}
	testserver.WaitFor(t, 30*time.Second, "tether serve "+strings.Join(args[1:], " ")+" to answer "+path, func() bool {
		select {
		case <-exited:
			t.Fatalf("tether %v exited: %v\n%s", args, waitErr, stderr.String())
		default:
		}
		resp, err := hc.Get("http://" + addr + path)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

func TestKubernetesBaseMatchesTheBinary(t *testing.T) {
	objs, images := loadBase(t)
	bin := testserver.Binary(t)
	known := serveFlags(t, bin, "serve")

	cm, ok := objs["ConfigMap/tether"]
	if !ok {
		t.Fatal("no ConfigMap tether")
	}
	sts, ok := objs["StatefulSet/tether"]
	if !ok {
		t.Fatal("no StatefulSet tether")
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 1 {
		t.Fatal("the Badger base runs exactly one replica (more need the etcd store)")
	}
	pod := sts.Spec.Template
	if !subset(sts.Spec.Selector.MatchLabels, pod.Metadata.Labels) || len(sts.Spec.Selector.MatchLabels) == 0 {
		t.Fatalf("StatefulSet selector %v does not select its pods %v", sts.Spec.Selector.MatchLabels, pod.Metadata.Labels)
	}
	if sc := pod.Spec.SecurityContext; sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Fatal("the pod must run as a non-root user")
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if !slices.Contains(images, c.Image) {
		t.Fatalf("container image %q is not one the kustomization sets (%v)", c.Image, images)
	}
	if c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation {
		t.Fatal("the container must not allow privilege escalation")
	}
	if len(c.Command) != 0 || len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Fatalf("the container must run the image's tether with `serve ...`, got command %v args %v", c.Command, c.Args)
	}
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef.Name != cm.Metadata.Name {
			t.Fatalf("envFrom names ConfigMap %q", ef.ConfigMapRef.Name)
		}
		for k, v := range cm.Data {
			env[k] = v
		}
	}
	flags := parseArgs(t, "statefulset", expand(t, "statefulset", c.Args[1:], env), known)

	// The data directory is the persistent volume.
	claims := map[string]bool{}
	for _, vct := range sts.Spec.VolumeClaimTemplates {
		claims[vct.Metadata.Name] = true
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		mounted = mounted || (claims[m.Name] && m.MountPath == flags["data-dir"])
	}
	if !mounted {
		t.Fatalf("--data-dir %q is not a volume claimed by the StatefulSet", flags["data-dir"])
	}

	// Ports: the flag, the container port, the Services and the probes agree.
	port := portOf(t, "statefulset", flags["listen"])
	if port != defaultPort {
		t.Fatalf("--listen port %d, want the default %d", port, defaultPort)
	}
	named := map[string]int{}
	for _, p := range c.Ports {
		named[p.Name] = p.ContainerPort
	}
	if named["http"] != port {
		t.Fatalf("container port http = %d, --listen says %d", named["http"], port)
	}
	for name, pr := range map[string]*probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if pr == nil || pr.HTTPGet == nil {
			t.Fatalf("no %s probe over HTTP", name)
		}
		if pr.HTTPGet.Path != healthPath || resolvePort(pr.HTTPGet.Port, named) != port {
			t.Fatalf("%s probe GET %s on %v, want %s on %d", name, pr.HTTPGet.Path, pr.HTTPGet.Port, healthPath, port)
		}
	}
	services := 0
	for key, o := range objs {
		if o.Kind != "Service" {
			continue
		}
		services++
		if sel := serviceSelector(o); !subset(sel, pod.Metadata.Labels) || len(sel) == 0 {
			t.Fatalf("%s selector %v does not select the pods %v", key, sel, pod.Metadata.Labels)
		}
		for _, p := range o.Spec.Ports {
			if resolvePort(p.TargetPort, named) != port {
				t.Fatalf("%s port %s targets %v, not the server's %d", key, p.Name, p.TargetPort, port)
			}
		}
	}
	if hs, ok := objs["Service/"+sts.Spec.ServiceName]; !ok || hs.Spec.ClusterIP != "None" {
		t.Fatalf("serviceName %q is not a headless Service", sts.Spec.ServiceName)
	}
	if services < 2 {
		t.Fatal("want a Service for clients and the headless one")
	}
	pdb, ok := objs["PodDisruptionBudget/tether"]
	if !ok {
		t.Fatal("no PodDisruptionBudget")
	}
	if !subset(pdb.Spec.Selector.MatchLabels, pod.Metadata.Labels) || len(pdb.Spec.Selector.MatchLabels) == 0 {
		t.Fatalf("PodDisruptionBudget selects %v, not the pods %v", pdb.Spec.Selector.MatchLabels, pod.Metadata.Labels)
	}
	if (pdb.Spec.MaxUnavailable == nil) == (pdb.Spec.MinAvailable == nil) {
		t.Fatal("the PodDisruptionBudget needs exactly one of maxUnavailable and minAvailable")
	}

	// Finally the flags as the pod passes them, on the real binary: it
	// starts, and the probe path answers.
	runServe(t, bin, flags, healthPath)
}

func resolvePort(p any, named map[string]int) int {
	switch v := p.(type) {
	case int:
		return v
	case string:
		if n, ok := named[v]; ok {
			return n
		}
		n, _ := strconv.Atoi(v)
		return n
	}
	return 0
}

func serviceSelector(o k8s) map[string]string {
	spec, _ := o.raw["spec"].(map[string]any)
	sel, _ := spec["selector"].(map[string]any)
	out := map[string]string{}
	for k, v := range sel {
		out[k] = fmt.Sprint(v)
	}
	return out
}

func subset(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestSystemdUnitMatchesTheBinary(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("systemd", "tether.service"))
	if err != nil {
		t.Fatal(err)
	}
	unit := map[string][]string{}
	env := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "[") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("unit line %q", line)
		}
		unit[k] = append(unit[k], v)
		if k == "Environment" {
			ek, ev, _ := strings.Cut(v, "=")
			env[ek] = ev
		}
	}
	if len(unit["ExecStart"]) != 1 {
		t.Fatal("want one ExecStart")
	}
	if unit["DynamicUser"] == nil && unit["User"] == nil {
		t.Fatal("the service must not run as root: set User= or DynamicUser=")
	}
	fields := strings.Fields(unit["ExecStart"][0])
	if len(fields) < 2 || filepath.Base(fields[0]) != "tether" || fields[1] != "serve" {
		t.Fatalf("ExecStart %q does not run tether serve", unit["ExecStart"][0])
	}
	bin := testserver.Binary(t)
	flags := parseArgs(t, "ExecStart", expand(t, "ExecStart", fields[2:], env), serveFlags(t, bin, "serve"))
	if state := unit["StateDirectory"]; len(state) != 1 || flags["data-dir"] != "/var/lib/"+state[0] {
		t.Fatalf("--data-dir %q is not the StateDirectory %v", flags["data-dir"], state)
	}
	if port := portOf(t, "ExecStart", flags["listen"]); port != defaultPort {
		t.Fatalf("--listen port %d, want %d", port, defaultPort)
	}
	runServe(t, bin, flags, healthPath)
}

func TestDockerfileBuildsAStaticNonRootImage(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var stages []string
	var final []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "FROM ") {
			stages = append(stages, line)
			final = nil
		}
		final = append(final, line)
	}
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a build stage and a runtime stage", len(stages))
	}
	text := string(b)
	if !regexp.MustCompile(`CGO_ENABLED=0\s+\S*\s*go build .*\./cmd/tether`).MatchString(text) && !strings.Contains(text, "CGO_ENABLED=0 GOOS=linux go build") {
		t.Fatal("the binary must be built with CGO_ENABLED=0 (static)")
	}
	// The builder's Go is the module's.
	mod, err := os.ReadFile(filepath.Join("..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\S+)`).FindSubmatch(mod)
	if goVersion == nil || !strings.Contains(stages[0], "golang:"+string(goVersion[1])) {
		t.Fatalf("build stage %q does not use the go.mod toolchain go %s", stages[0], goVersion[1])
	}
	var user, expose, entrypoint, cmd string
	for _, line := range final {
		verb, rest, _ := strings.Cut(line, " ")
		switch verb {
		case "USER":
			user = rest
		case "EXPOSE":
			expose = rest
		case "ENTRYPOINT":
			entrypoint = rest
		case "CMD":
			cmd = rest
		}
	}
	if uid, _, _ := strings.Cut(user, ":"); uid == "" || uid == "0" || uid == "root" {
		t.Fatalf("runtime USER %q must be non-root", user)
	}
	if expose != strconv.Itoa(defaultPort) {
		t.Fatalf("EXPOSE %q, want %d", expose, defaultPort)
	}
	if !strings.Contains(entrypoint, "tether") {
		t.Fatalf("ENTRYPOINT %q", entrypoint)
	}
	var args []string
	if err := yaml.Unmarshal([]byte(cmd), &args); err != nil || len(args) == 0 || args[0] != "serve" {
		t.Fatalf("CMD %q: want a JSON list starting with serve (%v)", cmd, err)
	}
	bin := testserver.Binary(t)
	flags := parseArgs(t, "CMD", args[1:], serveFlags(t, bin, "serve"))
	if port := portOf(t, "CMD", flags["listen"]); port != defaultPort {
		t.Fatalf("CMD listens on %d, want %d", port, defaultPort)
	}
	runServe(t, bin, flags, healthPath)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// TestDockerignoreKeepsLocalStateOutOfTheImage: the build context (the
// repository root) leaves out the data directory, built tools, benchmark
// results and every other local state, so an admin.token or a store never
// lands in an image layer.
func TestDockerignoreKeepsLocalStateOutOfTheImage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	patterns := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			patterns[strings.TrimSuffix(strings.TrimPrefix(line, "/"), "/")] = true
		}
	}
	for _, want := range []string{"tether-data", ".bin", "bench-results*", "node_modules", ".venv", ".git", "**/*.token"} {
		if !patterns[want] {
			t.Errorf(".dockerignore does not exclude %s", want)
		}
	}
	// What the build needs stays in.
	for _, keep := range []string{"go.mod", "go.sum", "cmd", "proto"} {
		if patterns[keep] {
			t.Errorf(".dockerignore excludes %s, which the build needs", keep)
		}
	}
}
