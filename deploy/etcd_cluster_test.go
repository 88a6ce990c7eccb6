package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/tetherhq/tether/controlplane/testserver"
	"github.com/tetherhq/tether/internal/etcdlocal"
	"github.com/tetherhq/tether/internal/etcdtest"
)

// The example of three replicas on a three-member etcd (etcd-cluster/):
// the kustomize overlay and the systemd units.

const etcdClusterDir = "etcd-cluster"

// readObjects decodes every YAML document of a file.
func readObjects(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var raw map[string]any
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if raw != nil {
			out = append(out, raw)
		}
	}
}

// as re-decodes a raw object into the typed subset the checks read.
func as(t *testing.T, raw map[string]any) k8s {
	t.Helper()
	b, _ := yaml.Marshal(raw)
	var o k8s
	if err := yaml.Unmarshal(b, &o); err != nil {
		t.Fatal(err)
	}
	o.raw = raw
	return o
}

// containerEnv is the env of a container: literal values, and a sample
// value standing for each field reference.
func containerEnv(t *testing.T, raw map[string]any, sample map[string]string) map[string]string {
	t.Helper()
	env := map[string]string{}
	spec, _ := raw["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	pod, _ := tmpl["spec"].(map[string]any)
	containers, _ := pod["containers"].([]any)
	for _, c := range containers {
		for _, e := range c.(map[string]any)["env"].([]any) {
			e := e.(map[string]any)
			name := e["name"].(string)
			if v, ok := e["value"]; ok {
				env[name] = fmt.Sprint(v)
				continue
			}
			v, ok := sample[name]
			if !ok {
				t.Fatalf("env %s comes from a reference the test has no sample for", name)
			}
			env[name] = v
		}
	}
	return env
}

func TestEtcdClusterOverlayMatchesTheBinary(t *testing.T) {
	dir := filepath.Join(etcdClusterDir, "kubernetes")
	var kust struct {
		Resources []string `yaml:"resources"`
		Patches   []struct {
			Path string `yaml:"path"`
		} `yaml:"patches"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &kust); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(kust.Resources, "../../kubernetes/base") {
		t.Fatalf("the overlay's resources %v do not include the base", kust.Resources)
	}
	listed := slices.Clone(kust.Resources)
	for _, p := range kust.Patches {
		listed = append(listed, p.Path)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	for _, f := range files {
		if base := filepath.Base(f); base != "kustomization.yaml" && !slices.Contains(listed, base) {
			t.Fatalf("%s is neither a resource nor a patch of the overlay", base)
		}
	}

	// The objects after the overlay, as far as the checks need: the base's
	// with the patches' fields, and the overlay's own.
	base, _ := loadBase(t)
	objs := map[string]map[string]any{}
	for _, r := range kust.Resources {
		if r == "../../kubernetes/base" {
			continue
		}
		for _, raw := range readObjects(t, filepath.Join(dir, r)) {
			o := as(t, raw)
			objs[o.Kind+"/"+o.Metadata.Name] = raw
		}
	}
	patches := map[string]map[string]any{}
	for _, p := range kust.Patches {
		for _, raw := range readObjects(t, filepath.Join(dir, p.Path)) {
			o := as(t, raw)
			key := o.Kind + "/" + o.Metadata.Name
			if _, ok := base[key]; !ok {
				t.Fatalf("%s patches %s, which the base does not have", p.Path, key)
			}
			patches[key] = raw
		}
	}

	// etcd: three members, each told of the others, with the store's limits.
	etcdSTS, ok := objs["StatefulSet/etcd"]
	if !ok {
		t.Fatal("no etcd StatefulSet")
	}
	etcd := as(t, etcdSTS)
	if etcd.Spec.Replicas == nil || *etcd.Spec.Replicas != 3 {
		t.Fatal("want three etcd members")
	}
	etcdSvc := as(t, objs["Service/"+etcd.Spec.ServiceName])
	if etcdSvc.Spec.ClusterIP != "None" {
		t.Fatalf("etcd's serviceName %q is not a headless Service", etcd.Spec.ServiceName)
	}
	etcdArgs := map[string]string{}
	for _, a := range etcd.Spec.Template.Spec.Containers[0].Args {
		k, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		etcdArgs[k] = v
	}
	for _, flag := range etcdlocal.StoreFlags {
		k, v, _ := strings.Cut(strings.TrimPrefix(flag, "--"), "=")
		if etcdArgs[k] != v {
			t.Errorf("etcd runs with --%s=%q; the store needs %s", k, etcdArgs[k], flag)
		}
	}
	var members []string
	for i := range 3 {
		members = append(members, fmt.Sprintf("%s-%d=http://%s-%d.%s:2380", etcd.Metadata.Name, i, etcd.Metadata.Name, i, etcd.Spec.ServiceName))
	}
	if got := etcdArgs["initial-cluster"]; got != strings.Join(members, ",") {
		t.Fatalf("etcd --initial-cluster=%s, want the three members %s", got, strings.Join(members, ","))
	}

	// Tether: three replicas on those members.
	sts := as(t, patches["StatefulSet/tether"])
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 {
		t.Fatal("want three Tether replicas")
	}
	if base["StatefulSet/tether"].Spec.Template.Spec.Containers[0].Name != sts.Spec.Template.Spec.Containers[0].Name {
		t.Fatal("the patch names a container the base does not have")
	}
	env := maps.Clone(base["ConfigMap/tether"].Data)
	maps.Copy(env, as(t, patches["ConfigMap/tether"]).Data)
	maps.Copy(env, containerEnv(t, patches["StatefulSet/tether"], map[string]string{"POD_NAME": "tether-1", "POD_NAMESPACE": "tether"}))
	c := sts.Spec.Template.Spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Fatalf("args %v do not run serve", c.Args)
	}
	bin := testserver.Binary(t)
	flags := parseArgs(t, "tether StatefulSet", expand(t, "tether StatefulSet", c.Args[1:], env), serveFlags(t, bin, "serve"))
	if flags["store"] != "etcd" {
		t.Fatalf("--store=%q, want etcd", flags["store"])
	}
	var endpoints []string
	for i := range 3 {
		endpoints = append(endpoints, fmt.Sprintf("http://%s-%d.%s:2379", etcd.Metadata.Name, i, etcd.Spec.ServiceName))
	}
	if flags["etcd-endpoints"] != strings.Join(endpoints, ",") {
		t.Fatalf("--etcd-endpoints=%s, want every member: %s", flags["etcd-endpoints"], strings.Join(endpoints, ","))
	}
	if flags["replica-id"] != "tether-1" {
		t.Fatalf("--replica-id=%s: want the pod's name, unique per replica", flags["replica-id"])
	}
	// The advertised URL is the pod's name in the headless Service, on the
	// port the server listens on.
	headless := base["StatefulSet/tether"].Spec.ServiceName
	u, err := url.Parse(flags["advertise-url"])
	if err != nil {
		t.Fatal(err)
	}
	if u.Hostname() != "tether-1."+headless+".tether.svc" || u.Port() != strconv.Itoa(portOf(t, "listen", flags["listen"])) {
		t.Fatalf("--advertise-url=%s, want the pod's DNS name in %s on the listen port", flags["advertise-url"], headless)
	}

	// The flags, as the pod passes them, on the real binary against a real
	// etcd: the replica starts and answers its health check.
	cluster := etcdtest.Start(t)
	flags["etcd-endpoints"] = strings.Join(cluster.Endpoints(), ",")
	flags["etcd-prefix"] = etcdtest.Prefix(t)
	delete(flags, "advertise-url") // default: the address it listens on
	runServe(t, bin, flags, healthPath)
}

func TestEtcdClusterSystemdUnitMatchesTheBinary(t *testing.T) {
	dir := filepath.Join(etcdClusterDir, "systemd")
	unit := map[string][]string{}
	env := map[string]string{}
	b, err := os.ReadFile(filepath.Join(dir, "tether-replica.service"))
	if err != nil {
		t.Fatal(err)
	}
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
	if unit["DynamicUser"] == nil && unit["User"] == nil {
		t.Fatal("the service must not run as root: set User= or DynamicUser=")
	}
	if len(unit["EnvironmentFile"]) != 1 || strings.HasPrefix(unit["EnvironmentFile"][0], "-") {
		t.Fatal("the replica's settings file must be required (no leading -): a replica without them cannot run")
	}
	// The example settings define what the unit needs.
	example := readEnvFile(t, filepath.Join(dir, "replica.env.example"))
	maps.Copy(env, example)
	fields := strings.Fields(unit["ExecStart"][0])
	if len(unit["ExecStart"]) != 1 || len(fields) < 2 || filepath.Base(fields[0]) != "tether" || fields[1] != "serve" {
		t.Fatalf("ExecStart %v does not run tether serve", unit["ExecStart"])
	}
	bin := testserver.Binary(t)
	flags := parseArgs(t, "ExecStart", expand(t, "ExecStart", fields[2:], env), serveFlags(t, bin, "serve"))
	if flags["store"] != "etcd" || flags["replica-id"] == "" || flags["advertise-url"] == "" {
		t.Fatalf("the replica needs --store etcd, --replica-id and --advertise-url: %v", flags)
	}
	if state := unit["StateDirectory"]; len(state) != 1 || flags["data-dir"] != "/var/lib/"+state[0] {
		t.Fatalf("--data-dir %q is not the StateDirectory %v", flags["data-dir"], state)
	}

	// etcd.env: three members, the store's limits, this host's addresses.
	etcdEnv := readEnvFile(t, filepath.Join(dir, "etcd.env"))
	for _, flag := range etcdlocal.StoreFlags {
		k, v, _ := strings.Cut(strings.TrimPrefix(flag, "--"), "=")
		name := "ETCD_" + strings.ToUpper(strings.ReplaceAll(k, "-", "_"))
		if etcdEnv[name] != v {
			t.Errorf("etcd.env sets %s=%q; the store needs %s", name, etcdEnv[name], flag)
		}
	}
	if n := len(strings.Split(etcdEnv["ETCD_INITIAL_CLUSTER"], ",")); n != 3 {
		t.Fatalf("ETCD_INITIAL_CLUSTER names %d members, want 3", n)
	}
	if !slices.Contains(strings.Split(env["TETHER_ETCD_ENDPOINTS"], ","), etcdEnv["ETCD_ADVERTISE_CLIENT_URLS"]) {
		t.Fatalf("the replica's endpoints %s do not include the member's %s", env["TETHER_ETCD_ENDPOINTS"], etcdEnv["ETCD_ADVERTISE_CLIENT_URLS"])
	}

	cluster := etcdtest.Start(t)
	flags["etcd-endpoints"] = strings.Join(cluster.Endpoints(), ",")
	flags["etcd-prefix"] = etcdtest.Prefix(t)
	delete(flags, "advertise-url")
	runServe(t, bin, flags, healthPath)
}

// readEnvFile reads KEY=value lines, skipping comments.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: line %q", path, line)
		}
		env[k] = v
	}
	return env
}
