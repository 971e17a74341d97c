package kwire.spark;

import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.lang.reflect.Field;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.net.URLClassLoader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.security.MessageDigest;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;
import java.util.zip.DeflaterOutputStream;
import java.util.zip.InflaterInputStream;

import org.apache.spark.sql.catalyst.encoders.HashableWeakReference;
import org.apache.spark.sql.catalyst.expressions.codegen.ByteCodeStats;
import org.apache.spark.sql.catalyst.expressions.codegen.CodeAndComment;
import org.apache.spark.sql.catalyst.expressions.codegen.CodeCompiler;
import org.apache.spark.sql.catalyst.expressions.codegen.GeneratedClass;
import org.apache.spark.util.NonFateSharingCache;
import org.apache.spark.util.ParentClassLoader;
import org.codehaus.commons.compiler.util.reflect.ByteArrayClassLoader;
import org.sparkproject.guava.cache.CacheBuilder;
import org.sparkproject.guava.cache.CacheLoader;
import org.sparkproject.guava.cache.LoadingCache;

import scala.Tuple2;
import scala.Tuple3;

/**
 * Spark's generated code, compiled by Janino once and kept on disk for later JVMs.
 *
 * <p>Spark compiles every generated class (whole-stage code, projections, orderings) with
 * Janino and keeps it in a cache that lives as long as the JVM. A kwire analysis of 100k
 * exchanges compiled 1,531 such classes, about 11 s of its threads' time, and the next
 * analysis, a new JVM, compiled the same source again. {@link #install} puts a loader in front
 * of Spark's own cache (the cache object stays Spark's; only the Guava cache inside it is
 * swapped): a miss looks for the class files under the source's SHA-256 in the directory
 * first, else lets Spark compile as before and stores what Janino made. The classes are
 * defined from those bytes as Janino defines them (a {@code ByteArrayClassLoader} over Spark's
 * {@code ParentClassLoader}). Source compiled by another compiler ({@code
 * spark.sql.codegen.compiler=jdk}), or against a class loader that adds classes of its own (a
 * REPL's, a Connect session's artifacts, added jars: a class of the same name may differ from one
 * run to the next), is left to Spark.
 *
 * <p>A file that cannot be read (cut short, another format) counts as a miss and is compiled
 * again; a store that fails is counted and the run goes on. Files are written whole (a
 * temporary file renamed), so JVMs sharing the directory never read a half-written one.
 * Written by hand: neither Spark nor Janino keeps compiled classes across JVMs.
 */
public final class CodegenDiskCache extends CacheLoader<Object, Object> {
  private static final int FORMAT = 1;
  private static final String GENERATED = "org.apache.spark.sql.catalyst.expressions.GeneratedClass";
  private static final AtomicLong HITS = new AtomicLong();
  private static final AtomicLong MISSES = new AtomicLong();
  private static final AtomicLong STORED = new AtomicLong();
  private static final AtomicLong FAILED = new AtomicLong();

  private final Path dir;
  private final LoadingCache<Object, Object> spark;
  private final Method compile;
  private final ClassLoader sparkLoader;

  private CodegenDiskCache(Path dir, LoadingCache<Object, Object> spark, Method compile, ClassLoader sparkLoader) {
    this.dir = dir;
    this.spark = spark;
    this.compile = compile;
    this.sparkLoader = sparkLoader;
  }

  /**
   * Puts the folder {@code directory} in front of Spark's code cache, keeping its size limit.
   * Returns "installed", or "moved" when this JVM had it (on another folder, or the same: the
   * classes already defined are then forgotten, and read again from the folder).
   */
  @SuppressWarnings("unchecked")
  public static synchronized String install(String directory, long maxEntries) throws Exception {
    Class<?> generator = Class.forName("org.apache.spark.sql.catalyst.expressions.codegen.CodeGenerator$");
    Field cacheField = generator.getDeclaredField("cache");
    cacheField.setAccessible(true);
    Object holder = cacheField.get(null);
    Field inner = NonFateSharingCache.class.getDeclaredField("cache");
    inner.setAccessible(true);
    Object current = inner.get(holder);
    boolean again = current instanceof Ours;
    if (again) {
      current = ((Ours) current).spark; // a second install points at another folder, cache emptied
    }
    Method compile = null;
    try {
      compile = generator.getMethod("$anonfun$cache$1", Tuple3.class); // Spark's loader, with its metrics
    } catch (NoSuchMethodException e) {
      // another Spark: its own cache compiles misses
    }
    Path dir = Paths.get(directory);
    Files.createDirectories(dir);
    CodegenDiskCache loader = new CodegenDiskCache(
        dir, (LoadingCache<Object, Object>) current, compile, org.apache.spark.util.Utils.getSparkClassLoader());
    inner.set(holder, new Ours(CacheBuilder.newBuilder().maximumSize(maxEntries).build(loader), loader.spark));
    return again ? "moved" : "installed";
  }

  /** hits, misses, stored, failed: this JVM's counts. */
  public static long[] counts() {
    return new long[] {HITS.get(), MISSES.get(), STORED.get(), FAILED.get()};
  }

  @Override
  public Object load(Object key) throws Exception {
    Tuple3<?, ?, ?> parts = (Tuple3<?, ?, ?>) key;
    CodeCompiler compiler = (CodeCompiler) parts._2();
    if (!"janino".equals(compiler.name())) {
      return spark.get(key);
    }
    ClassLoader parent = (ClassLoader) ((HashableWeakReference) parts._1()).get();
    if (!onlySparks(parent)) {
      return spark.get(key); // classes of a session's own (a REPL's, Connect artifacts) may change under one name
    }
    String body = ((CodeAndComment) parts._3()).body();
    Path file = fileFor(body);
    Object found = read(file, parent);
    if (found != null) {
      HITS.incrementAndGet();
      return found;
    }
    MISSES.incrementAndGet();
    Object compiled = compile(key);
    try {
      store(file, (Tuple2<?, ?>) compiled);
    } catch (IOException | ReflectiveOperationException | RuntimeException e) {
      FAILED.incrementAndGet();
    }
    return compiled;
  }

  /**
   * Whether {@code loader} sees only the classes Spark's own loader sees: it is that loader, or
   * class loaders without a URL of their own above it (a local executor's, with no added jar).
   */
  private boolean onlySparks(ClassLoader loader) {
    for (int depth = 0; loader != null && depth < 8; depth++) {
      if (loader == sparkLoader) {
        return true;
      }
      if (!(loader instanceof URLClassLoader) || ((URLClassLoader) loader).getURLs().length > 0) {
        return false;
      }
      loader = loader.getParent();
    }
    return false;
  }

  /** Spark's own compilation of {@code key}, throwing what Spark's loader throws (a compile
   * error is Spark's, not a reflection wrapper: Spark unwraps only the cache's own). */
  private Object compile(Object key) throws Exception {
    if (compile == null) {
      return spark.get(key);
    }
    try {
      return compile.invoke(null, key);
    } catch (InvocationTargetException e) {
      Throwable cause = e.getCause();
      if (cause instanceof Exception) {
        throw (Exception) cause;
      }
      if (cause instanceof Error) {
        throw (Error) cause;
      }
      throw e;
    }
  }

  private Path fileFor(String body) throws Exception {
    MessageDigest sha = MessageDigest.getInstance("SHA-256");
    String hex = HexFormat.of().formatHex(sha.digest(body.getBytes(StandardCharsets.UTF_8)));
    return dir.resolve(hex.substring(0, 2)).resolve(hex.substring(2) + ".class-set");
  }

  private static Object read(Path file, ClassLoader parent) {
    byte[] raw;
    try {
      raw = Files.readAllBytes(file);
    } catch (NoSuchFileException e) {
      return null;
    } catch (IOException e) {
      FAILED.incrementAndGet();
      return null;
    }
    try (DataInputStream in = new DataInputStream(new InflaterInputStream(new java.io.ByteArrayInputStream(raw)))) {
      if (in.readInt() != FORMAT) {
        return null;
      }
      ByteCodeStats stats = new ByteCodeStats(in.readInt(), in.readInt(), in.readInt());
      int n = in.readInt();
      Map<String, byte[]> classes = new HashMap<>();
      for (int i = 0; i < n; i++) {
        String name = in.readUTF();
        byte[] bytes = new byte[in.readInt()];
        in.readFully(bytes);
        classes.put(name, bytes);
      }
      if (!classes.containsKey(GENERATED)) {
        return null;
      }
      ClassLoader loader = new ByteArrayClassLoader(classes, new ParentClassLoader(parent));
      GeneratedClass made = (GeneratedClass) loader.loadClass(GENERATED).getConstructor().newInstance();
      return new Tuple2<>(made, stats);
    } catch (IOException | ReflectiveOperationException | RuntimeException | LinkageError e) {
      FAILED.incrementAndGet();
      return null;
    }
  }

  @SuppressWarnings("unchecked")
  private void store(Path file, Tuple2<?, ?> compiled) throws IOException, ReflectiveOperationException {
    ClassLoader loader = compiled._1().getClass().getClassLoader();
    if (!(loader instanceof ByteArrayClassLoader)) {
      return;
    }
    Field field = ByteArrayClassLoader.class.getDeclaredField("classes");
    field.setAccessible(true);
    Map<String, byte[]> classes = (Map<String, byte[]>) field.get(loader);
    ByteCodeStats stats = (ByteCodeStats) compiled._2();
    ByteArrayOutputStream buffer = new ByteArrayOutputStream();
    try (DataOutputStream out = new DataOutputStream(new DeflaterOutputStream(buffer))) {
      out.writeInt(FORMAT);
      out.writeInt(stats.maxMethodCodeSize());
      out.writeInt(stats.maxConstPoolSize());
      out.writeInt(stats.numInnerClasses());
      out.writeInt(classes.size());
      for (Map.Entry<String, byte[]> entry : classes.entrySet()) {
        out.writeUTF(entry.getKey());
        out.writeInt(entry.getValue().length);
        out.write(entry.getValue());
      }
    }
    Files.createDirectories(file.getParent());
    Path tmp = Files.createTempFile(file.getParent(), ".", ".tmp");
    try {
      Files.write(tmp, buffer.toByteArray());
      Files.move(tmp, file, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
      STORED.incrementAndGet();
    } finally {
      Files.deleteIfExists(tmp);
    }
  }

  /** The cache this class installs, holding Spark's own for a later install. */
  private static final class Ours extends org.sparkproject.guava.cache.ForwardingLoadingCache<Object, Object> {
    private final LoadingCache<Object, Object> delegate;
    private final LoadingCache<Object, Object> spark;

    Ours(LoadingCache<Object, Object> delegate, LoadingCache<Object, Object> spark) {
      this.delegate = delegate;
      this.spark = spark;
    }

    @Override
    protected LoadingCache<Object, Object> delegate() {
      return delegate;
    }
  }
}
