/* test_deploy: the container build (deploy/docker) and the Kubernetes
 * manifests (deploy/k8s), run for real: build.sh builds and checks the
 * binary, the rendered configuration and environment pass `idemproc
 * check-config` as the pod would run it, and a pod is rehearsed against a
 * broker and Redis. What is only a lint of the files (structure, ports,
 * probes, policies) is tests/check_deploy.sh (make check-deploy). */
#include "harness.h"

#include <criterion/criterion.h>
#include <ctype.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* kubectl as found on PATH (these machines ship it in /usr/bin). */
static char *kubectl(void)
{
    static char found[PATH_MAX];
    if (found[0])
        return found;
    const char *path = getenv("PATH");
    char *dirs = strdup(path ? path : "/usr/bin:/bin");
    char *rest = dirs;
    for (char *d = strsep(&rest, ":"); d; d = strsep(&rest, ":")) {
        snprintf(found, sizeof(found), "%s/kubectl", *d ? d : ".");
        if (access(found, X_OK) == 0)
            break;
        found[0] = '\0';
    }
    free(dirs);
    cr_assert(found[0], "kubectl is not on PATH");
    return found;
}
TestSuite(deploy, .fini = th_stack_cleanup);

#define POD_NAME "idemproc-5f7c9d8b6-x2x7q" /* what metadata.name gives */

static const char *const overlays[] = {"dev", "production", NULL};

/* ---- small helpers ---------------------------------------------------- */

/* Absolute path of a file in the source tree; caller frees. */
static char *src_path(const char *rel)
{
    char root[PATH_MAX];
    if (!realpath(th_src(), root))
        cr_assert_fail("IDEMPROC_SRC %s: cannot resolve", th_src());
    size_t size = strlen(root) + strlen(rel) + 2;
    char *p = malloc(size);
    snprintf(p, size, "%s/%s", root, rel);
    return p;
}

static char *write_file(const char *dir, const char *name, const char *text)
{
    char *path = malloc(PATH_MAX);
    snprintf(path, PATH_MAX, "%s/%s", dir, name);
    FILE *fp = fopen(path, "w");
    cr_assert(fp, "cannot write %s", path);
    fputs(text, fp);
    fclose(fp);
    return path;
}

/* Follows a path of object keys; "#N" indexes an array. Borrowed result,
 * NULL when any step is missing. */
static json_t *jget(json_t *o, ...)
{
    va_list ap;
    va_start(ap, o);
    for (const char *k = va_arg(ap, const char *); k && o;
         k = va_arg(ap, const char *)) {
        if (k[0] == '#')
            o = json_array_get(o, (size_t)atoi(k + 1));
        else
            o = json_object_get(o, k);
    }
    va_end(ap);
    return o;
}

#define JGET(o, ...) jget((o), __VA_ARGS__, (const char *)NULL)

static const char *jstr(json_t *o)
{
    return json_is_string(o) ? json_string_value(o) : NULL;
}

/* Integer of a JSON number or of a numeric string (annotations). */
static long long jint(json_t *o)
{
    if (json_is_integer(o))
        return json_integer_value(o);
    if (json_is_string(o))
        return atoll(json_string_value(o));
    return -1;
}

/* Parses a stream of JSON documents (what kubectl prints for several
 * objects); a "List" contributes its items. New reference. */
static json_t *parse_objects(const char *text)
{
    json_t *all = json_array();
    size_t len = strlen(text), off = 0;
    while (off < len) {
        while (off < len && isspace((unsigned char)text[off]))
            off++;
        if (off >= len)
            break;
        json_error_t e;
        json_t *o =
            json_loadb(text + off, len - off, JSON_DISABLE_EOF_CHECK, &e);
        cr_assert(o, "kubectl JSON at byte %zu: %s", off, e.text);
        off += (size_t)e.position;
        if (!strcmp(jstr(JGET(o, "kind")) ? jstr(JGET(o, "kind")) : "",
                    "List")) {
            json_array_extend(all, JGET(o, "items"));
            json_decref(o);
        } else {
            json_array_append_new(all, o);
        }
    }
    return all;
}

/* YAML file -> JSON objects, offline: `kubectl annotate --local` parses
 * the manifests without a cluster (built-in kinds and CRDs alike) and can
 * print JSON, which jansson reads. */
static json_t *yaml_file_to_json(const char *path)
{
    char *argv[] = {kubectl(),    "annotate", "--local", "-f",
                    (char *)path, "-o",       "json",    "idemproc.io/parsed=1",
                    NULL};
    char *out = NULL, *err = NULL;
    int rc = th_run(argv, &out, &err, 60000);
    cr_assert_eq(rc, 0, "kubectl annotate --local %s: %s", path, err);
    json_t *objs = parse_objects(out);
    free(out);
    free(err);
    return objs;
}

/* Renders a kustomization directory; returns its objects. */
static json_t *render_dir(const char *dir)
{
    char *argv[] = {kubectl(), "kustomize", (char *)dir, NULL};
    char *out = NULL, *err = NULL;
    int rc = th_run(argv, &out, &err, 60000);
    cr_assert_eq(rc, 0, "kubectl kustomize %s failed (%d): %s", dir, rc, err);
    cr_assert(out && *out, "kubectl kustomize %s: empty output", dir);
    char *tmp = th_tmpdir();
    char *path = write_file(tmp, "rendered.yaml", out);
    json_t *objs = yaml_file_to_json(path);
    th_rmrf(tmp);
    free(tmp);
    free(path);
    free(out);
    free(err);
    return objs;
}

static json_t *render_overlay(const char *overlay)
{
    char rel[256];
    snprintf(rel, sizeof(rel), "deploy/k8s/overlays/%s", overlay);
    char *dir = src_path(rel);
    json_t *objs = render_dir(dir);
    free(dir);
    return objs;
}

/* First object of `kind` whose name is `name` (or starts with it when
 * prefix is set; any name when NULL). Borrowed. */
static json_t *find_obj(json_t *objs, const char *kind, const char *name,
                        int prefix)
{
    size_t i;
    json_t *o;
    json_array_foreach(objs, i, o)
    {
        const char *k = jstr(JGET(o, "kind"));
        const char *n = jstr(JGET(o, "metadata", "name"));
        if (!k || strcmp(k, kind))
            continue;
        if (!name || (n && (prefix ? !strncmp(n, name, strlen(name))
                                   : !strcmp(n, name))))
            return o;
    }
    return NULL;
}

static json_t *processor(json_t *objs)
{
    json_t *d = find_obj(objs, "Deployment", "idemproc", 0);
    cr_assert(d, "no Deployment idemproc in the rendered overlay");
    return d;
}

static json_t *container_named(json_t *workload, const char *name)
{
    size_t i;
    json_t *c;
    json_array_foreach(JGET(workload, "spec", "template", "spec", "containers"),
                       i, c)
    {
        if (!strcmp(jstr(JGET(c, "name")), name))
            return c;
    }
    cr_assert_fail("no container %s", name);
    return NULL;
}

/* The value of `key=` in a properties text; NULL when absent. Caller
 * frees. */
static char *prop_get(const char *props, const char *key)
{
    size_t kl = strlen(key);
    for (const char *l = props; l && *l;) {
        const char *nl = strchr(l, '\n');
        size_t ll = nl ? (size_t)(nl - l) : strlen(l);
        while (ll && isspace((unsigned char)*l)) {
            l++;
            ll--;
        }
        if (ll > kl && !strncmp(l, key, kl)) {
            const char *r = l + kl;
            while (r < l + ll && (*r == ' ' || *r == '\t'))
                r++;
            if (*r == '=') {
                r++;
                while (r < l + ll && isspace((unsigned char)*r))
                    r++;
                size_t vl = (size_t)(l + ll - r);
                while (vl && isspace((unsigned char)r[vl - 1]))
                    vl--;
                return strndup(r, vl);
            }
        }
        l = nl ? nl + 1 : NULL;
    }
    return NULL;
}

/* Replaces every occurrence of `from` in s by `to`. New string. */
static char *replace_all(const char *s, const char *from, const char *to)
{
    size_t fl = strlen(from), tl = strlen(to), n = 0;
    for (const char *p = strstr(s, from); p; p = strstr(p + fl, from))
        n++;
    char *out = malloc(strlen(s) + n * (tl > fl ? tl - fl : 0) + 1);
    char *w = out;
    for (const char *p; (p = strstr(s, from));) {
        memcpy(w, s, (size_t)(p - s));
        w += p - s;
        memcpy(w, to, tl);
        w += tl;
        s = p + fl;
    }
    strcpy(w, s);
    return out;
}

static const char *const secret_dummy[] = {"test-secret-redis-password",
                                           "test-secret-kafka-sasl-password"};

/* ---- the configuration a pod of `workload` would run with ----------- */

typedef struct {
    char *dir;   /* temp dir: properties and fake secret files */
    char *conf;  /* effective configuration printed by check-config */
    char *err;   /* its stderr */
    int rc;      /* check-config exit code */
    char *props; /* the ConfigMap's properties, as rendered */
} pod_conf_t;

static void pod_conf_free(pod_conf_t *pc)
{
    th_rmrf(pc->dir);
    free(pc->dir);
    free(pc->conf);
    free(pc->err);
    free(pc->props);
}

static const char *mount_path(json_t *c, const char *volume)
{
    size_t i;
    json_t *m;
    json_array_foreach(JGET(c, "volumeMounts"), i, m)
    {
        if (!strcmp(jstr(JGET(m, "name")), volume))
            return jstr(JGET(m, "mountPath"));
    }
    return NULL;
}

static json_t *volume_named(json_t *workload, const char *name)
{
    size_t i;
    json_t *v;
    json_array_foreach(JGET(workload, "spec", "template", "spec", "volumes"), i,
                       v)
    {
        if (!strcmp(jstr(JGET(v, "name")), name))
            return v;
    }
    return NULL;
}

/* Runs `idemproc check-config` the way the pod runs `idemproc run`: the
 * container's args (run -> check-config, -c pointing at the rendered
 * ConfigMap), its environment (Downward API values filled in), the Service
 * link variables Kubernetes would inject unless enableServiceLinks is
 * false, and the Secret mounted at the credentials mount point (here a temp
 * dir with one file per key of base/secret.example.yaml, since the real
 * paths do not exist on this machine). */
/* A pod to start for real instead of checking its configuration: the
 * properties keys to point at this machine's broker and Redis, the
 * working directory, and where its stderr goes. */
typedef struct {
    const char *const *overrides; /* "key=value" lines replacing the file's */
    const char *cwd;
    const char *log;
    pid_t pid; /* out */
} pod_run_t;

static char *props_override(const char *props, const char *const *overrides)
{
    char *out = strdup(props);
    for (int i = 0; overrides && overrides[i]; i++) {
        const char *eq = strchr(overrides[i], '=');
        size_t kl = (size_t)(eq - overrides[i]);
        size_t n = strlen(out) + strlen(overrides[i]) + 2;
        char *next = malloc(n);
        next[0] = '\0';
        int found = 0;
        char *save = NULL;
        for (char *line = strtok_r(out, "\n", &save); line;
             line = strtok_r(NULL, "\n", &save)) {
            if (!strncmp(line, overrides[i], kl) &&
                (line[kl] == '=' || line[kl] == ' ')) {
                line = (char *)overrides[i];
                found = 1;
            }
            strcat(next, line);
            strcat(next, "\n");
        }
        if (!found) {
            strcat(next, overrides[i]);
            strcat(next, "\n");
        }
        free(out);
        out = next;
    }
    return out;
}

static void pod_prepare(json_t *objs, json_t *workload, const char *cname,
                        pod_conf_t *pc, pod_run_t *run)
{
    memset(pc, 0, sizeof(*pc));
    pc->dir = th_tmpdir();
    json_t *pod = JGET(workload, "spec", "template", "spec");
    json_t *c = container_named(workload, cname);

    /* The ConfigMap mounted as the config volume. */
    json_t *cv = volume_named(workload, "config");
    cr_assert(cv, "no config volume");
    const char *cm_name = jstr(JGET(cv, "configMap", "name"));
    json_t *cm = find_obj(objs, "ConfigMap", cm_name, 0);
    cr_assert(cm, "ConfigMap %s (mounted) is not rendered", cm_name);
    const char *props = jstr(JGET(cm, "data", "idemproc.properties"));
    cr_assert(props, "ConfigMap %s has no idemproc.properties", cm_name);
    pc->props = strdup(props);
    const char *cm_mount = mount_path(c, "config");
    cr_assert(cm_mount, "config volume not mounted");

    /* Secret files. */
    char secrets[PATH_MAX];
    snprintf(secrets, sizeof(secrets), "%s/secrets/", pc->dir);
    cr_assert_eq(mkdir(secrets, 0700), 0);
    char *example = src_path("deploy/k8s/base/secret.example.yaml");
    json_t *ex = yaml_file_to_json(example);
    free(example);
    const char *key;
    json_t *val;
    json_object_foreach(JGET(ex, "#0", "stringData"), key, val)
    {
        char body[256];
        snprintf(body, sizeof(body), "test-secret-%s\n", key);
        free(write_file(secrets, key, body));
    }
    json_decref(ex);
    const char *sec_mount = mount_path(c, "credentials");
    char sec_prefix[PATH_MAX] = "/nonexistent-mount/";
    if (sec_mount)
        snprintf(sec_prefix, sizeof(sec_prefix), "%s/", sec_mount);

    char *rewritten = replace_all(props, sec_prefix, secrets);
    if (run) {
        char *o = props_override(rewritten, run->overrides);
        free(rewritten);
        rewritten = o;
    }
    char *conf_path = write_file(pc->dir, "idemproc.properties", rewritten);
    free(rewritten);

    /* Environment. */
    char *env[128];
    int en = 0;
    env[en++] = strdup("PATH=/usr/bin:/bin");
    size_t i;
    json_t *e;
    json_array_foreach(JGET(c, "env"), i, e)
    {
        const char *name = jstr(JGET(e, "name"));
        const char *value = jstr(JGET(e, "value"));
        const char *field = jstr(JGET(e, "valueFrom", "fieldRef", "fieldPath"));
        char buf[1024];
        if (value) {
            char *v = replace_all(value, sec_prefix, secrets);
            snprintf(buf, sizeof(buf), "%s=%s", name, v);
            free(v);
        } else if (field && !strcmp(field, "metadata.name")) {
            snprintf(buf, sizeof(buf), "%s=%s", name, POD_NAME);
        } else if (field && !strcmp(field, "metadata.namespace")) {
            snprintf(buf, sizeof(buf), "%s=%s", name, "test-namespace");
        } else {
            cr_assert_fail("env %s: this test cannot fill in its valueFrom",
                           name);
        }
        cr_assert_lt(en, 120);
        env[en++] = strdup(buf);
    }
    if (!json_is_false(JGET(pod, "enableServiceLinks"))) {
        json_t *o;
        json_array_foreach(objs, i, o)
        {
            const char *k = jstr(JGET(o, "kind"));
            if (!k || strcmp(k, "Service"))
                continue;
            char up[256];
            const char *n = jstr(JGET(o, "metadata", "name"));
            size_t j = 0;
            for (; n[j] && j + 1 < sizeof(up); j++)
                up[j] = n[j] == '-' ? '_' : (char)toupper((unsigned char)n[j]);
            up[j] = '\0';
            long long port = jint(JGET(o, "spec", "ports", "#0", "port"));
            char buf[512];
            snprintf(buf, sizeof(buf), "%s_SERVICE_HOST=10.96.0.10", up);
            env[en++] = strdup(buf);
            snprintf(buf, sizeof(buf), "%s_PORT=tcp://10.96.0.10:%lld", up,
                     port);
            env[en++] = strdup(buf);
            cr_assert_lt(en, 120);
        }
    }
    env[en] = NULL;

    /* Arguments: the container's, with run -> check-config. */
    json_t *args = JGET(c, "args");
    cr_assert(json_array_size(args) >= 1 &&
                  !strcmp(jstr(JGET(args, "#0")), "run"),
              "container args must start with run");
    char *argv[64];
    int an = 0;
    argv[an++] = (char *)th_bin();
    argv[an++] = run ? "run" : "check-config";
    char cm_file[PATH_MAX];
    snprintf(cm_file, sizeof(cm_file), "%s/idemproc.properties", cm_mount);
    int saw_c = 0;
    for (size_t k = 1; k < json_array_size(args) && an < 60; k++) {
        const char *a = jstr(json_array_get(args, k));
        if (!strcmp(a, "-c") || !strcmp(a, "--config")) {
            const char *p = jstr(json_array_get(args, ++k));
            cr_assert(p && !strcmp(p, cm_file),
                      "-c %s is not the mounted ConfigMap file %s", p, cm_file);
            argv[an++] = "-c";
            argv[an++] = conf_path;
            saw_c = 1;
        } else {
            argv[an++] = (char *)a;
        }
    }
    argv[an] = NULL;
    cr_assert(saw_c, "container args have no -c FILE");

    if (run)
        run->pid = th_spawn_in(run->cwd, argv, NULL, run->log, env);
    else
        pc->rc = th_run_env(argv, env, &pc->conf, &pc->err, 30000);
    for (int k = 0; k < en; k++)
        free(env[k]);
    free(conf_path);
}

static void pod_conf_load(json_t *objs, json_t *workload, const char *cname,
                          pod_conf_t *pc)
{
    pod_prepare(objs, workload, cname, pc, NULL);
}

/* Loads the processor's effective configuration and asserts it is valid. */
static void processor_conf(json_t *objs, const char *overlay, pod_conf_t *pc)
{
    pod_conf_load(objs, processor(objs), "idemproc", pc);
    cr_assert_eq(pc->rc, 0, "%s: check-config rejects the pod's config: %s",
                 overlay, pc->err);
}

/* ---- the image ------------------------------------------------------ */

/* The runtime stage installs exactly what the binary links: each NEEDED
 * library's Debian package (dpkg -S) must be in build.sh's list. */
Test(deploy, runtime_packages_cover_linked_libraries)
{
    char *script = src_path("deploy/docker/build.sh");
    char *argv[] = {"/bin/sh", script, "check-runtime", (char *)th_bin(), NULL};
    char *out = NULL, *err = NULL;
    int rc = th_run(argv, &out, &err, 60000);
    cr_expect_eq(rc, 0, "build.sh check-runtime %s: %s%s", th_bin(), out, err);
    cr_expect(strstr(out, "librdkafka.so.1 librdkafka1"), "%s", out);
    free(out);
    free(err);

    char *argv2[] = {"/bin/sh", script, "runtime-packages", NULL};
    rc = th_run(argv2, &out, NULL, 10000);
    cr_assert_eq(rc, 0);
    /* Only runtime packages: no compiler or headers in the slim image. */
    cr_expect_null(strstr(out, "-dev"), "%s", out);
    cr_expect_null(strstr(out, "build-essential"), "%s", out);
    cr_expect(strstr(out, "ca-certificates\n"), "TLS to Kafka needs CAs: %s",
              out);
    free(out);
    free(script);
}

/* What the Dockerfile's build stage runs, run here into a temp DESTDIR
 * (and a temp object dir, so the work tree's build/ is not touched). */
Test(deploy, build_script_installs_runnable_binary, .timeout = 600)
{
    char *tmp = th_tmpdir();
    char *script = src_path("deploy/docker/build.sh");
    char destdir[PATH_MAX], builddir[PATH_MAX], bin[2 * PATH_MAX];
    snprintf(destdir, sizeof(destdir), "%s/root", tmp);
    snprintf(builddir, sizeof(builddir), "BUILD_DIR=%s/build", tmp);
    snprintf(bin, sizeof(bin), "%s/usr/local/bin/idemproc", destdir);
    char path_env[4096];
    snprintf(path_env, sizeof(path_env), "PATH=%s",
             getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
    char *env[] = {path_env, builddir, "JOBS=2", "LC_ALL=C", NULL};
    char *argv[] = {"/bin/sh", script, "build", destdir, NULL};
    char *out = NULL, *err = NULL;
    int rc = th_run_env(argv, env, &out, &err, 590000);
    cr_assert_eq(rc, 0, "build.sh build failed (%d):\n%s\n%s", rc, out, err);
    cr_expect(strstr(out, "runtime packages:"), "%s", out);
    free(out);
    free(err);

    char *argv2[] = {bin, "--version", NULL};
    rc = th_run(argv2, &out, &err, 10000);
    cr_expect_eq(rc, 0, "%s --version: %s", bin, err);
    cr_expect(!strncmp(out, "idemproc ", 9), "%s", out);
    free(out);
    free(err);

    char *argv3[] = {"/bin/sh", script, "check-runtime", bin, NULL};
    rc = th_run(argv3, &out, &err, 60000);
    cr_expect_eq(rc, 0, "check-runtime: %s%s", out, err);
    free(out);
    free(err);
    free(script);
    th_rmrf(tmp);
    free(tmp);
}

/* ---- the manifests -------------------------------------------------- */

/* Every container that runs the processor (args starting with run, in a
 * Deployment or a Job) passes check-config with its pod's configuration
 * and environment: the processor exits 2 on an IDEMPROC_* variable that
 * names no key, or on a value it rejects. */
Test(deploy, configmap_passes_check_config, .timeout = 120)
{
    for (int i = 0; overlays[i]; i++) {
        const char *ov = overlays[i];
        json_t *objs = render_overlay(ov);
        int runs = 0;
        size_t k;
        json_t *o;
        json_array_foreach(objs, k, o)
        {
            const char *kind = jstr(JGET(o, "kind"));
            if (strcmp(kind, "Deployment") && strcmp(kind, "Job"))
                continue;
            const char *name = jstr(JGET(o, "metadata", "name"));
            size_t j;
            json_t *c;
            json_array_foreach(
                JGET(o, "spec", "template", "spec", "containers"), j, c)
            {
                const char *cmd = jstr(JGET(c, "args", "#0"));
                if (!cmd || strcmp(cmd, "run"))
                    continue;
                runs++;
                pod_conf_t pc;
                pod_conf_load(objs, o, jstr(JGET(c, "name")), &pc);
                cr_expect_eq(pc.rc, 0,
                             "%s %s: check-config rejects the pod's config: %s",
                             ov, name, pc.err);
                cr_expect(strstr(pc.conf, "member.id=" POD_NAME "\n"),
                          "%s %s: member.id is not the pod name:\n%s", ov, name,
                          pc.conf);
                for (size_t s = 0; s < 2; s++)
                    cr_expect_null(strstr(pc.conf, secret_dummy[s]),
                                   "%s %s: secret printed:\n%s", ov, name,
                                   pc.conf);
                pod_conf_free(&pc);
            }
        }
        cr_expect_gt(runs, 0, "%s: no container runs the processor", ov);
        json_decref(objs);
    }
}

/* Production reads its credentials from the mounted Secret (that every
 * *.file key points into it is check_deploy.sh's part): the values really
 * arrive, check-config shows the non-secret username and masks the rest. */
Test(deploy, production_credentials_from_secret_files, .timeout = 120)
{
    json_t *objs = render_overlay("production");
    pod_conf_t pc;
    processor_conf(objs, "production", &pc);
    cr_expect(strstr(pc.conf, "kafka.security.protocol=SASL_SSL\n"), "%s",
              pc.conf);
    cr_expect(strstr(pc.conf, "kafka.sasl.username=test-secret-"), "%s",
              pc.conf);
    cr_expect(strstr(pc.conf, "redis.password=[redacted]\n"), "%s", pc.conf);
    cr_expect(strstr(pc.conf, "kafka.sasl.password=[redacted]\n"), "%s",
              pc.conf);
    /* Redis: TLS with verification, an ACL user. */
    cr_expect(strstr(pc.conf, "redis.url=rediss://"), "%s", pc.conf);
    cr_expect(strstr(pc.conf, "redis.tls.verify=true\n"), "%s", pc.conf);
    cr_expect(strstr(pc.conf, "redis.username=idemproc\n"), "%s", pc.conf);
    pod_conf_free(&pc);
    json_decref(objs);
}

/* The rehearsal's stack, at file scope so the suite's .fini can stop it
 * after a failed assertion. */
static th_stack_t stk;

/* The pod rehearsal: the processor runs exactly as its container would
 * (arguments, environment with the pod name, configuration only from the
 * mounted ConfigMap file and the Secret files, another working directory)
 * against this machine's broker and Redis; SIGTERM arrives while traffic
 * flows; it must exit 0 within the grace period (less the preStop sleep)
 * without losing anything, and write nothing where it runs. */
Test(deploy, pod_rehearsal_sigterm_during_traffic, .timeout = 240)
{
    json_t *objs = render_overlay("dev");
    json_t *d = processor(objs);
    long long grace = jint(
        JGET(d, "spec", "template", "spec", "terminationGracePeriodSeconds"));
    cr_assert_gt(grace, 0);

    cr_assert_eq(th_stack_start(&stk, 6, NULL), 0);
    char boot[300], redis[128], listen[64];
    snprintf(boot, sizeof(boot), "kafka.bootstrap.servers=%s",
             stk.broker.bootstrap);
    snprintf(redis, sizeof(redis), "redis.url=%s", stk.redis.url);
    /* Tests use 127.0.0.1 only; the pod listens on 0.0.0.0. */
    snprintf(listen, sizeof(listen), "http.listen=127.0.0.1:%d",
             th_free_port());
    const char *overrides[] = {boot,
                               redis,
                               listen,
                               "kafka.fetch.wait.max.ms=10",
                               "kafka.session.timeout.ms=6000",
                               "message.max.bytes=4096",
                               NULL};

    /* Traffic keeps flowing while the pod is stopped. */
    char *pargv[] = {(char *)th_bin(),
                     "produce",
                     "-b",
                     stk.broker.bootstrap,
                     "-t",
                     "payments",
                     "--count",
                     "20000",
                     "--rate",
                     "4000",
                     "--duplicates",
                     "0.1",
                     "--poison",
                     "0.01",
                     "--too-large-bytes",
                     "5000",
                     "--seed",
                     "21",
                     "--expect",
                     stk.expect,
                     NULL};
    pid_t producer = th_spawn(pargv, NULL, NULL, NULL);

    char *cwd = th_tmpdir();
    char log1[600], log2[600];
    snprintf(log1, sizeof(log1), "%s/pod1.log", stk.dir);
    snprintf(log2, sizeof(log2), "%s/pod2.log", stk.dir);
    pod_conf_t pc1, pc2;
    pod_run_t run1 = {.overrides = overrides, .cwd = cwd, .log = log1};
    pod_prepare(objs, d, "idemproc", &pc1, &run1);
    sleep(6); /* joined and busy, traffic still arriving */
    kill(run1.pid, SIGTERM);
    int rc = th_wait(run1.pid, (int)(grace * 1000 - 5000));
    char *l1 = th_slurp(log1, NULL);
    cr_expect_eq(rc, 0, "SIGTERM: exit %d, want 0 within %lld s:\n%.2000s", rc,
                 grace - 5, l1 ? l1 : "");
    cr_expect(l1 && strstr(l1, "stopped cleanly"), "no clean stop");
    free(l1);
    if (rc < 0)
        th_stop(run1.pid, 1000);

    /* The next pod takes over; together nothing is lost or doubled. */
    pod_run_t run2 = {.overrides = overrides, .cwd = cwd, .log = log2};
    pod_prepare(objs, d, "idemproc", &pc2, &run2);
    cr_expect_eq(th_wait(producer, 60000), 0, "produce failed");
    char *vout = NULL;
    /* verify as the pods' group: the DLQ is filtered by dlq.group. */
    char *group = prop_get(pc1.props, "group.id");
    char gset[256];
    snprintf(gset, sizeof(gset), "group.id=%s", group);
    free(group);
    const char *vsets[] = {gset, NULL};
    int vrc = th_stack_wait_verified(&stk, 1, vsets, 90000, &vout);
    cr_expect_eq(vrc, 0, "after the rehearsal verify is not exact:\n%s", vout);
    free(vout);
    cr_expect_eq(th_stop(run2.pid, (int)(grace * 1000)), 0);

    /* Nothing written where the pod runs (its root file system is
     * read-only; only /tmp is writable). */
    char *lsargv[] = {"/bin/ls", "-A", cwd, NULL};
    char *ls = NULL;
    th_run(lsargv, &ls, NULL, 10000);
    cr_expect_str_eq(ls ? ls : "", "", "the pod wrote into its directory");
    free(ls);
    th_rmrf(cwd);
    free(cwd);
    pod_conf_free(&pc1);
    pod_conf_free(&pc2);
    th_stack_stop(&stk);
    json_decref(objs);
}

/* ---- the outbox relay component ------------------------------------- */

/* The dev overlay with the optional outbox component. */
static json_t *render_dev_with_outbox(void)
{
    char *tmp = th_tmpdir();
    char *dev = src_path("deploy/k8s/overlays/dev");
    char *outbox = src_path("deploy/k8s/components/outbox");
    char text[3 * PATH_MAX];
    snprintf(text, sizeof(text),
             "apiVersion: kustomize.config.k8s.io/v1beta1\n"
             "kind: Kustomization\n"
             "resources:\n  - ../..%s\ncomponents:\n  - ../..%s\n",
             dev, outbox);
    free(write_file(tmp, "kustomization.yaml", text));
    json_t *objs = render_dir(tmp);
    th_rmrf(tmp);
    free(tmp);
    free(dev);
    free(outbox);
    return objs;
}

/* The relay's configuration (the mounted ConfigMap, with the DSN from the
 * example Secret at the mounted path) passes `check-config --for outbox`
 * without printing the DSN. (How the component is put together is
 * check_deploy.sh's part.) */
Test(deploy, outbox_config_passes_check_config, .timeout = 120)
{
    json_t *objs = render_dev_with_outbox();
    json_t *d = find_obj(objs, "Deployment", "idemproc-outbox", 0);
    cr_assert(d, "no idemproc-outbox Deployment");
    json_t *c = container_named(d, "outbox");
    json_t *cv = volume_named(d, "config");
    json_t *cm =
        find_obj(objs, "ConfigMap", jstr(JGET(cv, "configMap", "name")), 0);
    cr_assert(cm, "the mounted ConfigMap is not rendered");
    const char *props = jstr(JGET(cm, "data", "outbox.properties"));
    cr_assert(props);
    const char *dsn_mount = mount_path(c, "dsn");
    cr_assert(dsn_mount, "no dsn volume mounted");
    char *example =
        src_path("deploy/k8s/components/outbox/secret.example.yaml");
    json_t *ex = yaml_file_to_json(example);
    free(example);
    const char *dsn = jstr(JGET(ex, "#0", "stringData", "dsn"));
    cr_assert(dsn && strstr(dsn, "password="), "the example has a dsn");
    char *dir = th_tmpdir();
    free(write_file(dir, "dsn", dsn));
    char from[PATH_MAX], to[PATH_MAX];
    snprintf(from, sizeof(from), "%s/", dsn_mount);
    snprintf(to, sizeof(to), "%s/", dir);
    char *rewritten = replace_all(props, from, to);
    char *conf = write_file(dir, "outbox.properties", rewritten);
    free(rewritten);
    char *argv[] = {
        (char *)th_bin(), "check-config", "--for", "outbox", "-c", conf, NULL};
    char *env[] = {"PATH=/usr/bin:/bin", "IDEMPROC_MEMBER_ID=pod-0", NULL};
    char *out = NULL, *err = NULL;
    cr_expect_eq(th_run_env(argv, env, &out, &err, 30000), 0, "%s", err);
    cr_expect(out && strstr(out, "outbox.dsn=[redacted]\n"), "%s", out);
    const char *pw = strstr(dsn, "password=") + 9;
    cr_expect(out && !strstr(out, pw), "the DSN's password is printed");
    free(out);
    free(err);
    free(conf);
    th_rmrf(dir);
    free(dir);
    json_decref(ex);
    json_decref(objs);
}

/* ---- the Redis Cluster component ------------------------------------ */

/* The dev overlay with components/redis-cluster: check-config, whose
 * cluster-mode checks (the partition layout, the ledger, no Sentinel)
 * refuse a configuration the member would refuse, accepts the pod's, with
 * the seed nodes from the component. */
Test(deploy, redis_cluster_component_passes_check_config, .timeout = 120)
{
    char *tmp = th_tmpdir();
    char *dev = src_path("deploy/k8s/overlays/dev");
    char *comp = src_path("deploy/k8s/components/redis-cluster");
    char text[3 * PATH_MAX];
    snprintf(text, sizeof(text),
             "apiVersion: kustomize.config.k8s.io/v1beta1\n"
             "kind: Kustomization\n"
             "resources:\n  - ../..%s\ncomponents:\n  - ../..%s\n",
             dev, comp);
    free(write_file(tmp, "kustomization.yaml", text));
    json_t *objs = render_dir(tmp);
    pod_conf_t pc;
    processor_conf(objs, "dev+redis-cluster", &pc);
    cr_expect(strstr(pc.conf, "redis.cluster.nodes=redis-cluster-0."), "%s",
              pc.conf);
    cr_expect(strstr(pc.conf, "dedup.scope=partition\n"), "%s", pc.conf);
    pod_conf_free(&pc);
    json_decref(objs);
    th_rmrf(tmp);
    free(tmp);
    free(dev);
    free(comp);
}
